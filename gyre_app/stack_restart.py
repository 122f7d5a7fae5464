"""`gyre restart SERVICE`: one service of a running stack restarted in place (shell: processes).

The same port and settings, nothing else touched: NATS, Postgres and the other services keep
running, so executions carry on. The settings are the ones the stack recorded when it started the
service (`ServiceProcess.settings_env`), not the caller's: a `gyre restart` from another shell, or
from an empty environment, must not drop a custom task folder or point at another bus prefix. The
supervisor (`gyre_app.supervise`) restarts a dead service through `restart_if_dead`; a lock file
serialises it with a manual `gyre restart`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from gyre.devstack.processes import is_our_process, terminate, write_json
from gyre.settings import KernelSettings, stack_state_path
from gyre_app.stack import (
    SETTINGS_PREFIX,
    ServiceProcess,
    kernel_env,
    load_state,
    spawn_service,
    wait_serving,
)


def restart(kernel: KernelSettings, name: str, *, timeout_s: float = 120.0) -> ServiceProcess:
    """Restart one service of a running stack in place: the same port and settings, nothing else
    touched (NATS, Postgres and the other services keep running, so executions carry on). A
    service that died is started again; one that runs is stopped first."""
    state_dir = kernel.state_dir.resolve()
    with _restart_lock(state_dir):
        started = _restart(kernel, name, state_dir, timeout_s=timeout_s, only_if_dead=False)
    assert started is not None
    return started


def restart_if_dead(kernel: KernelSettings, name: str, *, timeout_s: float = 120.0) -> ServiceProcess | None:
    """`restart` for a service whose process is gone; None when it runs (the supervisor's call,
    serialised with a manual `gyre restart` through a lock file)."""
    state_dir = kernel.state_dir.resolve()
    with _restart_lock(state_dir):
        return _restart(kernel, name, state_dir, timeout_s=timeout_s, only_if_dead=True)


@contextlib.contextmanager
def _restart_lock(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with (state_dir / "restart.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _restart(
    kernel: KernelSettings, name: str, state_dir: Path, *, timeout_s: float, only_if_dead: bool
) -> ServiceProcess | None:
    state = load_state(state_dir)
    if state is None:
        raise RuntimeError(f"no stack runs from {state_dir} (gyre up starts one)")
    old = next((s for s in state.services if s.name == name), None)
    if old is None:
        raise RuntimeError(f"the stack runs no {name!r}; it runs {', '.join(s.name for s in state.services)}")
    if only_if_dead and is_our_process(old.pid, old.marker):
        return None
    terminate(old.pid, old.marker, timeout_s=15.0)
    ports = {s.name: int(s.address.rsplit(":", 1)[1]) for s in state.services}
    metrics_port = int(old.metrics_url.split(":")[2].split("/")[0]) if old.metrics_url else None
    if old.settings_env:  # the caller's shell keeps only what is no setting (PATH, HOME, ...)
        env = {k: v for k, v in os.environ.items() if not k.startswith(SETTINGS_PREFIX)}
    else:  # recorded before stacks kept their settings: the best guess left is the caller's
        env = kernel_env(state.nats_url, state.database_url, kernel.bus_prefix)
    proxy_http_port = int(state.proxy_http_url.rsplit(":", 1)[1]) if state.proxy_http_url else 0
    service = spawn_service(
        name,
        state_dir=state_dir,
        env=env,
        ports=ports,
        proxy_http_port=proxy_http_port,
        metrics_port=metrics_port,
        module=old.module or name,
        mode=state.mode or "gyre",
        secure=bool(state.tls),
        extra_env=dict(old.settings_env),  # last, so it wins over the defaults spawn_service adds
    )
    state.services[state.services.index(old)] = service
    write_json(stack_state_path(state_dir), asdict(state))
    wait_serving(service, time.monotonic() + timeout_s)
    return service
