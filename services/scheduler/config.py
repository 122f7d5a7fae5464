"""Scheduler settings, env prefix GYRE_SCHEDULER_ (shell)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import PositiveFloat
from pydantic_settings import BaseSettings, SettingsConfigDict

BUNDLED_TASKS = Path(__file__).resolve().parents[1] / "evaluator" / "tasks"


class SchedulerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_SCHEDULER_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 50051
    """gRPC port; 0 picks a free one."""
    proxy_address: str = ""
    """The proxy's gRPC `host:port`: cells are routed and drained through it (empty: no switching)."""
    runner_address: str = ""
    """The runner's gRPC `host:port`: CancelTask stops running harnesses through it."""
    mode: Literal["colocate", "async", "gyre", "burst"] = "gyre"
    """Scheduling mode at the first start (later: SetMode; the stored mode wins on restart)."""
    lost_grace_s: PositiveFloat = 300.0
    """An execution with no end event this long past its limit is cancelled through the runner;
    twice this long past it, the scheduler ends it as an infrastructure failure (`watchdog`)."""
    cell_lost_after_s: float = 5.0
    """A cell whose heartbeat is silent this long is declared lost."""
    drain_timeout_s: float = 30.0
    """How long a rollout -> training switch waits for the proxy to move the cell's calls."""
    admission: Literal["paced", "at_submit"] = "paced"
    """paced: the policy admits tasks within its staleness cap as cells have room (a task waits
    while no cell serves); at_submit: every execution is scheduled when its task is submitted."""
    groups_per_step: int = 1
    """B, as the trainer takes them (GYRE_TRAINER_GROUPS_PER_STEP)."""
    max_staleness: int = 2
    """K: a task admitted at version v is trained by step v+K."""
    step_overhead_s: float = 1.0
    rollout_to_training_s: float = 0.5
    training_to_rollout_s: float = 0.5
    """The policy's estimates of an update and of a switch each way; once cells have switched, the
    median of the recent measured switches replaces the switch estimates."""
    tokens_per_group_guess: int = 1000
    tokens_per_s_per_cell_guess: float = 1000.0
    """Until the first step is observed: a group's target tokens and one cell's training rate."""
    tick_s: float = 0.5
    """The driver decides on every change and at least this often."""
    harnesses: tuple[str, ...] = ("gyre-agent", "claude-code", "mini-swe-agent")
    """Harnesses the runners can start; a task naming another is refused at submission."""
    families: tuple[str, ...] = ("repo_generation", "repo_repair", "terminal", "swebench", "harbor")
    """Task families the evaluator grades; a task of another family is refused at submission."""
    model_dir: Path | None = None
    """The policy's checkpoint folder: a task whose prompt alone fills its context window is
    refused at submission (`prompt_window.py`). Unset: not checked."""
    tasks_dir: Path = BUNDLED_TASKS
    """The task set (`task:<name>` templates): the same folder as the runner's and evaluator's."""
