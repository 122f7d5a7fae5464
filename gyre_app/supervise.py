"""Keep the local stack's services running: a service that died is started again in place, on its
port, without touching the rest (shell: processes, files).

`gyre up` starts this as a detached process (`python -m gyre_app.supervise`), its pid in
`<state>/supervisor.json`; `gyre down` stops it first. Every `POLL_S` it reads `stack.json` and
restarts each service whose process is gone (`gyre_app.stack_restart.restart`, which serialises with a
manual `gyre restart` through a lock file). A service that keeps dying is given up after
`MAX_RESTARTS` restarts within `WINDOW_S`, with a log line that says so. It exits when the stack
is gone.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections import deque
from pathlib import Path

import structlog

from gyre.devstack.processes import is_our_process, read_json, spawn_detached, terminate, write_json
from gyre.logs import configure_logging
from gyre.settings import KernelSettings, stack_state_path

log = structlog.get_logger(__name__)
POLL_S = 1.0
MAX_RESTARTS = 5
WINDOW_S = 600.0
MARKER = "gyre_app.supervise"
PID_FILE = "supervisor.json"


def dead_services(kernel: KernelSettings) -> list[str]:
    """Names of the stack's services whose process is gone."""
    from gyre_app.stack import load_state

    state = load_state(kernel.state_dir.resolve())
    if state is None:
        return []
    return [s.name for s in state.services if not is_our_process(s.pid, s.marker)]


def revive(kernel: KernelSettings) -> list[str]:
    """Start again, in place, every service of the stack that died; returns their names."""
    from gyre_app.stack_restart import restart_if_dead

    revived = []
    for name in dead_services(kernel):
        if restart_if_dead(kernel, name) is not None:
            revived.append(name)
    return revived


def supervise(kernel: KernelSettings, *, max_polls: int = 10**9) -> None:
    """The loop: poll, restart the dead, give up on a crash loop; ends when the stack is down."""
    state_path = stack_state_path(kernel.state_dir.resolve())
    restarts: dict[str, deque[float]] = {}
    given_up: set[str] = set()
    for _ in range(max_polls):  # bounded: ends with the stack
        if not state_path.exists():
            return
        for name in dead_services(kernel):
            if name in given_up:
                continue
            recent = restarts.setdefault(name, deque())
            while recent and recent[0] < time.monotonic() - WINDOW_S:
                recent.popleft()
            if len(recent) >= MAX_RESTARTS:
                given_up.add(name)
                log.error("service_crash_loop", service=name, restarts=len(recent), window_s=WINDOW_S)
                continue
            recent.append(time.monotonic())
            log.warning("service_died", service=name)
            try:
                from gyre_app.stack_restart import restart_if_dead

                started = restart_if_dead(kernel, name)
            except RuntimeError as exc:  # it died again during start-up: the next poll retries
                log.error("service_restart_failed", service=name, error=str(exc)[:500])
                continue
            if started is not None:
                log.info("service_restarted", service=name, pid=started.pid, address=started.address)
        time.sleep(POLL_S)


def start_supervisor(kernel: KernelSettings, env: dict[str, str], cwd: Path) -> int:
    """Spawn the supervisor for the stack in `kernel.state_dir` (detached); returns its pid."""
    state_dir = kernel.state_dir.resolve()
    stop_supervisor(state_dir)
    pid = spawn_detached(
        [sys.executable, "-m", MARKER],
        log_path=state_dir / "logs" / "supervisor.log",
        cwd=cwd,
        env={**env, "GYRE_STATE_DIR": str(state_dir), "GYRE_BUS_PREFIX": kernel.bus_prefix},
    )
    write_json(state_dir / PID_FILE, {"pid": pid})
    return pid


def stop_supervisor(state_dir: Path) -> bool:
    """Stop the stack's supervisor (before its services, or it would start them again)."""
    recorded = read_json(state_dir / PID_FILE) or {}
    pid = recorded.get("pid")
    (state_dir / PID_FILE).unlink(missing_ok=True)
    return isinstance(pid, int) and terminate(pid, MARKER, timeout_s=10.0)


def supervisor_pid(state_dir: Path) -> int | None:
    recorded = read_json(state_dir / PID_FILE) or {}
    pid = recorded.get("pid")
    return pid if isinstance(pid, int) and is_our_process(pid, MARKER) else None


def main() -> int:
    kernel = KernelSettings()
    configure_logging(fmt=kernel.log_format, level=kernel.log_level)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        supervise(kernel)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
