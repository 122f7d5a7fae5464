"""An execution's sandbox, made before its harness starts: a bubblewrap root or its container (shell)."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import time
from collections.abc import Callable
from typing import Any

from gyre.errors import GyreError
from gyre.sandbox.host import Forward, Sandbox, SandboxHost
from gyre.sandbox.limits import MIB
from gyre.sandbox.oci import OciBackend
from gyre.sandbox.trees import CopyBounds
from services.runner.config import RunnerSettings
from services.runner.container_exec import ContainerSandbox, read_spec, task_folder
from services.runner.executions import Launch
from services.runner.git_scrub import ScrubFailed
from services.runner.harness import limits_for
from services.runner.workspace import WorkspaceError, fill

FILL_TIMEOUT_S = 300.0


class LaunchFailed(Exception):
    def __init__(self, kind: str, reason: str):
        super().__init__(reason)
        self.kind = kind
        self.reason = reason[:4096]


async def fill_sandbox(
    host: SandboxHost, settings: RunnerSettings, launch: Launch, *, keep: Callable[[Any], None]
) -> Sandbox:
    """A bubblewrap root with the task's template filled in and the prompt in its home; `keep`
    gets the sandbox as soon as it exists, so a failure later still releases it."""
    try:
        box = await host.create(launch.execution_id, limits_for(launch.harness, settings.limits()))
    except (OSError, subprocess.SubprocessError, GyreError) as exc:
        raise LaunchFailed("sandbox", f"sandbox could not be created: {exc}") from exc
    keep(box)
    try:
        bounds = CopyBounds(max_bytes=settings.disk_mb * MIB, deadline=time.monotonic() + FILL_TIMEOUT_S)
        await asyncio.to_thread(
            fill, launch.workspace_template, box.work, settings.template_sources(), bounds=bounds
        )
        (box.home / "prompt.md").write_text(launch.prompt)
        await asyncio.to_thread(box.own_files)
    except WorkspaceError as exc:
        raise LaunchFailed("workspace", str(exc)) from exc
    except OSError as exc:
        raise LaunchFailed("workspace", f"workspace could not be filled: {exc}") from exc
    return box


async def start_container(
    backend: OciBackend | None,
    settings: RunnerSettings,
    launch: Launch,
    forward: Forward,
    *,
    keep: Callable[[Any], None],
) -> ContainerSandbox:
    """A container of the task's own image, its repository cut back to the base (`keep` as above)."""
    if backend is None:
        raise LaunchFailed("sandbox", "the runner's host has no container engine (podman and runc)")
    box = ContainerSandbox(settings.sandbox_root, launch.execution_id)
    keep(box)
    try:
        spec = read_spec(task_folder(launch.task, settings.tasks_dir))
        spec = dataclasses.replace(spec, limits=spec.limits.scaled(**settings.container_multipliers()))
        await box.start(
            backend,
            spec,
            forward=forward,
            max_connections=settings.limits().max_connections,
            prompt=launch.prompt,
        )
    except (OSError, GyreError, ScrubFailed) as exc:
        raise LaunchFailed("sandbox", f"the task's container could not be prepared: {exc}") from exc
    return box
