"""Evaluator settings, env prefix GYRE_EVALUATOR_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from gyre.sandbox.limits import SandboxLimits
from services.evaluator.taskset import BUNDLED


class EvaluatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_EVALUATOR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port; 0 picks a free one."""
    sandbox_root: Path = Path(".gyre/evaluator/sandboxes")
    """Where grading sandboxes live while a grade runs; not under /tmp."""
    sandbox_mode: str = "auto"
    uid_base: int = 63000
    """First uid of grading sandbox users; apart from the runner's range."""
    tasks_dir: Path = BUNDLED
    attempts: int = 3
    """Grader runs before a crash is reported."""
    cpu_s: int = 600
    memory_mb: int = 1024
    max_procs: int = 128
    file_size_mb: int = 128
    disk_mb: int = 512

    def limits(self) -> SandboxLimits:
        return SandboxLimits.of(self)
