"""Take over a container execution a previous runner process started (shell: files, the engine).

A runner that stops or is killed leaves its containers running: the harness inside is the
container's, not the runner's, child. The restarted runner knows which executions it was running
from its own tables; `adopt_container` rebuilds the `ContainerSandbox` of one from what its
start wrote (`container.json` in its folder: image, workdir, base commit, limits) and `resume`
opens a new forwarder on the same socket path, which the container's relay reaches as before.
The adopted sandbox is waited for (through the files its harness wrapper writes inside), killed,
exported and released exactly like one this process started.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.forward import Forwarder
from gyre.sandbox.host import Forward
from gyre.sandbox.oci import Container, OciBackend
from gyre.sandbox.oci_disk import WorkDisk
from services.runner.config import RunnerSettings
from services.runner.container_exec import STATE_FILE, ContainerSandbox, ContainerSpec, owner_label


def adopt_container(root: Path, execution_id: str, backend: OciBackend | None) -> ContainerSandbox | None:
    """The container sandbox of `execution_id` under `root`, or None when its start never
    finished (no state written) or this host has no engine. Its container may be gone: check
    `box.alive()` before waiting for it."""
    sandbox = ContainerSandbox(root, execution_id)
    path = sandbox.path / STATE_FILE
    if backend is None or not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        limits = ContainerLimits(**state["limits"])
        sandbox.spec = ContainerSpec(
            image=state["image"], workdir=state["workdir"], base_commit=state["base"], limits=limits
        )
        sandbox.base, sandbox.image_path = state["base"], state["image_path"]
        box = Container(name=sandbox.name, engine=backend.engine, limits=limits, staged=state["staged"])
        box.storage_base_mb = float(state["storage_base_mb"])
        box.disk = WorkDisk(sandbox.name) if state.get("disk") else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    sandbox.box = box
    sandbox.started_at = time.monotonic()
    return sandbox


async def resume(
    sandbox: ContainerSandbox, backend: OciBackend, forward: Forward, *, max_connections: int
) -> None:
    """A new forwarder on the adopted sandbox's socket path (the old one died with its runner)."""
    sandbox.forwarder = Forwarder(
        folder=sandbox.path / "forward",
        host=forward.host,
        port=forward.port,
        max_connections=max_connections,
        uid=backend.host_uid(0),
    )
    await sandbox.forwarder.start()


async def adopt_running(
    settings: RunnerSettings, execution_id: str, backend: OciBackend | None, forward: Forward
) -> ContainerSandbox | None:
    """A running execution's container, re-attached with a new forwarder; None when it is gone
    (the execution then ends as runner lost, an infrastructure fact)."""
    sandbox = adopt_container(settings.sandbox_root, execution_id, backend)
    if sandbox is None or sandbox.box is None or backend is None:
        return None
    if not await sandbox.box.alive():
        # Its container is gone, so nothing will close it: its disk would stay mounted for good.
        if sandbox.box.disk is not None:
            await sandbox.box.disk.remove()
        return None
    await resume(sandbox, backend, forward, max_connections=settings.limits().max_connections)
    return sandbox


async def sweep_containers(backend: OciBackend | None, root: Path, *, keep: frozenset[str]) -> int:
    """Remove this runner's containers but those of the kept sandbox folders (`c-<execution>`):
    what a killed runner left that no execution still needs."""
    if backend is None:
        return 0
    names = frozenset(f"gyre-run-{k.removeprefix('c-')}" for k in keep if k.startswith("c-"))
    return await backend.sweep(owner_label(root), keep=names)
