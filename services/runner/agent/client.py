"""OpenAI Chat Completions over HTTP, with the proxy's agent headers (shell: network)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from typing import Any

ROLE_HEADER = "X-Gyre-Agent-Role"
ID_HEADER = "X-Gyre-Agent-Id"
IDEMPOTENCY_HEADER = "Idempotency-Key"


class ModelError(Exception):
    """The model endpoint failed for good (after retries) or answered something unusable."""


DEFAULT_RETRY_S = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatClient:
    base_url: str
    """e.g. `http://127.0.0.1:18080/v1`; `/chat/completions` is appended."""
    api_key: str
    model: str
    max_tokens: int = 1024
    temperature: float | None = None
    """Sampling temperature sent with every request; None leaves the endpoint's default."""
    timeout_s: float = 600.0
    retry_s: float = DEFAULT_RETRY_S
    """How long a failing endpoint is retried (5xx, 429, a refused or cut connection), with
    back-off up to 8 s: long enough for a restarting proxy or engine, a Postgres restart or
    failover (the proxy answers 503 while it cannot record a call: at 120 s, a 180 s outage
    failed every running execution), or a moment when no cell is in rollout (a 503). The
    execution's deadline still bounds it."""

    def complete(
        self,
        messages: list[dict[str, Any]],
        *,
        role: str,
        agent_id: str,
        tools: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One completion; returns the assistant message (`content`, maybe `tool_calls`)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": self.max_tokens}
        if tools:
            body["tools"] = tools
        if self.temperature is not None:
            body["temperature"] = self.temperature
        request = urllib.request.Request(
            self.base_url.rstrip("/") + "/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {self.api_key}",
                ROLE_HEADER: role,
                ID_HEADER: agent_id,
                # One key for every attempt of this call: a retry of a call the proxy recorded
                # (its answer lost in a proxy restart) gets that answer, not a second call.
                IDEMPOTENCY_HEADER: uuid.uuid4().hex,
            },
            method="POST",
        )
        last = ""
        deadline = time.monotonic() + self.retry_s
        for attempt in range(10_000):  # bounded by the deadline
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as resp:
                    answer = json.loads(resp.read())
                return dict(answer["choices"][0]["message"])
            except urllib.error.HTTPError as exc:
                last = f"HTTP {exc.code}: {exc.read()[:500]!r}"
                if exc.code < 500 and exc.code != 429:
                    break  # a refused token or a bad request does not get better
            except (urllib.error.URLError, OSError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            except (KeyError, IndexError, ValueError) as exc:  # an unusable answer: tried 3 times
                last = f"{type(exc).__name__}: {exc}"
                if attempt >= 2:
                    break
            if time.monotonic() >= deadline:
                break
            time.sleep(min(8.0, 0.5 * 2**attempt))
        raise ModelError(f"chat completion failed: {last}")
