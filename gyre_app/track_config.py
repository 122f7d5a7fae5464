"""Tracker settings, env prefix GYRE_TRACK_ (shell)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict


class TrackSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_TRACK_", extra="ignore")

    sinks: str = "jsonl"
    """Comma-separated: jsonl, tensorboard, wandb, mlflow, trackio; `none` turns tracking off
    (`gyre up --track` adds to jsonl)."""
    dir: Path | None = None
    """The run's tracking folder; unset: `<state>/track/<run_name>`."""
    run_name: str = ""
    """The run's name in every sink; unset: `run-<UTC start time>`."""
    project: str = "gyre"
    """W&B project, MLflow experiment, Trackio project."""
    samples_per_step: int = 4
    """Executions in each step's sample table (best and worst rewards, alternately)."""
    atif: bool = True
    """Write each trained execution as an ATIF trajectory under `<dir>/atif/`."""
    tokenizer_dir: Path | None = None
    """Where the tokenizer is, to decode prompts, outputs and tool calls; unset: `<state>/model`
    when it has one (otherwise calls stay token counts and `tool_call/parse_errors` is not logged)."""
    poll_s: float = 1.0
    """How often the tracker reads the bus for new events."""

    def resolved_run_name(self) -> str:
        return self.run_name or datetime.now(UTC).strftime("run-%Y%m%dT%H%M%SZ")
