"""The runner's Prometheus gauge, read from its supervisor when scraped (shell)."""

from __future__ import annotations

from gyre.metrics import register_gauge
from services.runner.supervisor import Supervisor


def register(supervisor: Supervisor) -> None:
    register_gauge(
        "gyre_runner_executions",
        "Executions on this runner: running (a harness started or waiting for a slot) and kept "
        "(ended, the sandbox and workspace kept for grading).",
        lambda: {"running": len(supervisor.running), "kept": len(supervisor.ended)},
        key="state",
    )
