"""Scheduler settings, env prefix GYRE_SCHEDULER_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

BUNDLED_TASKS = Path(__file__).resolve().parents[1] / "evaluator" / "tasks"


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_SCHEDULER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    """gRPC port; 0 picks a free one."""
    harnesses: tuple[str, ...] = ("gyre-agent", "claude-code", "mini-swe-agent")
    """Harnesses the runners can start; a task naming another is refused at submission."""
    families: tuple[str, ...] = ("repo_generation", "repo_repair", "terminal")
    """Task families the evaluator grades; a task of another family is refused at submission."""
    tasks_dir: Path = BUNDLED_TASKS
    """The task set (`task:<name>` templates): the same folder as the runner's and evaluator's."""
