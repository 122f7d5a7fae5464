"""Proxy: harness-facing model API (OpenAI / Anthropic), TITO recording, routing, migration."""
