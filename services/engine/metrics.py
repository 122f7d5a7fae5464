"""The engine's Prometheus gauges, read from the backend's own stats when scraped (shell)."""

from __future__ import annotations

from gyre.metrics import register_gauge
from services.engine.port import EngineBackend


def register(backend: EngineBackend, *, engine_id: str, cell_id: str) -> None:
    labels = {"engine_id": engine_id, "cell_id": cell_id}
    register_gauge(
        "gyre_engine_output_tokens_per_second",
        "Tokens the engine generated per second over its recent window.",
        lambda: backend.stats().output_tokens_per_s,
        labels=labels,
    )
    register_gauge(
        "gyre_engine_generations",
        "Generations on the engine, by state: running (decoding), waiting (queued), paused.",
        lambda: _generations(backend),
        labels=labels,
        key="state",
    )
    register_gauge(
        "gyre_engine_policy_version",
        "Policy version of the weights the engine serves.",
        lambda: backend.stats().policy_version,
        labels=labels,
    )


def _generations(backend: EngineBackend) -> dict[str, float]:
    stats = backend.stats()
    return {"running": stats.num_running, "waiting": stats.num_waiting, "paused": stats.num_paused}
