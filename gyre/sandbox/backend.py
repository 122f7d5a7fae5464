"""The interface every sandbox backend gives, and the limits of a container (pure).

A task picks its backend by family: Gyre's own families run in the bubblewrap root
(`gyre.sandbox.host`), tasks that bring their own OCI image (`swebench`, `harbor`) run in that
image on a local container engine (`gyre.sandbox.oci`). A Kubernetes backend
(`gyre.sandbox.k8s`: a pod of the task's image under the RuntimeClass in `deploy/k8s`) gives the
same interface; it has not run against a cluster here.

Example:
    limits = ContainerLimits(cpus=1.0, memory_mb=4096, storage_mb=10240).scaled(cpus=2.0)
    box = await backend.create(name="grade-1", image="gyre-task-x:1", limits=limits)
    result = await box.exec(["bash", "-lc", "pytest -rA"], timeout_s=600, workdir="/testbed")
    await box.close()
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gyre.errors import InvalidArgument


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerLimits:
    """What one container may use; a task's own figures, times the deployment's multipliers."""

    cpus: float = 1.0
    memory_mb: int = 4096
    storage_mb: int = 10240
    """Bytes the container may write over its image (its writable layer), checked by `exec`."""
    max_procs: int = 1024
    open_files: int = 1024

    def validate(self, at: str = "environment") -> None:
        if not (
            isinstance(self.cpus, (int, float)) and math.isfinite(self.cpus) and 0.01 <= self.cpus <= 1024
        ):
            raise InvalidArgument(
                f"{at}.cpus", f"must be a number of CPUs in [0.01, 1024], got {self.cpus!r}"
            )
        for name, low in (("memory_mb", 16), ("storage_mb", 1), ("max_procs", 16), ("open_files", 64)):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= low):
                raise InvalidArgument(f"{at}.{name}", f"must be an integer of at least {low}, got {value!r}")

    def scaled(self, *, cpus: float = 1.0, memory: float = 1.0, storage: float = 1.0) -> ContainerLimits:
        """The same limits with the deployment's multipliers applied.

        Example: ContainerLimits(cpus=1.0, memory_mb=2048).scaled(cpus=0.5, memory=2.0)
                 -> ContainerLimits(cpus=0.5, memory_mb=4096, ...)
        """
        return ContainerLimits(
            cpus=round(self.cpus * cpus, 3),
            memory_mb=max(16, round(self.memory_mb * memory)),
            storage_mb=max(1, round(self.storage_mb * storage)),
            max_procs=self.max_procs,
            open_files=self.open_files,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecResult:
    """How one command inside a sandbox ended."""

    exit_code: int | None
    """None when it was killed at its deadline (`timed_out`)."""
    output: bytes
    """stdout and stderr together, cut to the caller's limit (`truncated`)."""
    timed_out: bool = False
    truncated: bool = False
    storage_exceeded: bool = False
    """The container's writable layer grew past `ContainerLimits.storage_mb`."""


class SandboxBox(Protocol):
    """One running sandbox: commands run in it, files go in and out, then it is closed."""

    name: str

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        workdir: str = "",
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 8 << 20,
        user: str = "",
    ) -> ExecResult:
        """`user` ("uid:gid") runs it as that user inside; empty: the sandbox's own root."""
        ...

    async def upload(self, source: str, dest: str) -> None:
        """Copy a host file or folder to `dest` inside (created, replacing nothing else)."""
        ...

    async def download(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        """A regular file's bytes; None when it does not exist."""
        ...

    async def alive(self) -> bool: ...

    async def close(self) -> None:
        """Stop and remove it with everything it wrote; idempotent."""
        ...


class SandboxBackend(Protocol):
    """Makes boxes from images on one engine (a local Podman or Docker; a cluster later)."""

    async def image_present(self, image: str) -> bool: ...

    async def create(
        self,
        *,
        name: str,
        image: str,
        limits: ContainerLimits,
        forward_folder: str = "",
        listen_port: int = 18080,
    ) -> SandboxBox: ...
