"""Evaluator settings, env prefix GYRE_EVALUATOR_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic_settings import BaseSettings, SettingsConfigDict

from gyre.sandbox.limits import SandboxLimits
from gyre.sandbox.oci import OciBackend
from services.evaluator.container_grading import ContainerGrader
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
    copy_max_files: int = 100_000
    """Files and folders a workspace may hold to be graded; more scores 0 with the reason."""
    copy_max_depth: int = 64
    """Folder depth a workspace may have to be graded; deeper scores 0 with the reason."""
    cpu_s: int = 600
    memory_mb: int = 1024
    max_procs: int = 128
    file_size_mb: int = 128
    disk_mb: int = 512
    cpus: float = 1.0

    container_attempts: int = 2
    """Grading containers started for one grade before it is reported not assessable."""
    container_cpus: float = 1.0
    """Multiplier on a container task's own `environment.cpus` (also memory, storage below)."""
    container_memory: float = 1.0
    container_storage: float = 1.0

    def container_grader(self, backend: OciBackend) -> ContainerGrader:
        return ContainerGrader(
            backend,
            attempts=self.container_attempts,
            cpus=self.container_cpus,
            memory=self.container_memory,
            storage=self.container_storage,
            owner=f"evaluator:{self.sandbox_root.resolve()}",
        )

    def limits(self) -> SandboxLimits:
        return SandboxLimits.of(self)

    def grader_bounds(self) -> dict[str, int]:
        """Keyword arguments of `Grader` from these settings."""
        return {"attempts": self.attempts, "max_files": self.copy_max_files, "max_depth": self.copy_max_depth}
