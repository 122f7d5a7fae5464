"""Detached server processes: launch, recognise by command line, wait for, and report on (shell)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

LOG_TAIL_CHARS = 3000
POLL_S = 0.05


def spawn_detached(argv: list[str], *, log_path: Path, cwd: Path, env: dict[str, str] | None = None) -> int:
    """Start `argv` as an orphan in its own session, output appended to `log_path`; return its PID.

    The shell in between exits at once, so the server is not our child: it outlives us, a Ctrl-C on
    `gyre up` does not reach it, and no zombie or "still running" warning is left behind in this process.
    """
    script = 'log=$1; shift; "$@" </dev/null >>"$log" 2>&1 & echo $!'
    launched = subprocess.run(
        ["/bin/sh", "-c", script, "sh", str(log_path), *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
        start_new_session=True,
        env=env,
    )
    pid = as_int(launched.stdout.strip())
    if launched.returncode != 0 or pid is None:
        raise failure(f"could not launch {argv[0]}: {launched.stderr.strip()}", log_path)
    return pid


def terminate(pid: int, marker: str, *, timeout_s: float) -> bool:
    """SIGTERM our process `pid` (known by `marker`), SIGKILL after `timeout_s`; False if it was gone."""
    return terminate_all([(pid, marker)], timeout_s=timeout_s) == [True]


def terminate_all(processes: list[tuple[int, str]], *, timeout_s: float) -> list[bool]:
    """`terminate` for each (pid, marker), side by side: every one is sent SIGTERM before any is
    waited for, so their shutdowns overlap instead of adding up; whichever still runs `timeout_s`
    after the signals is killed. Per process, False if it was gone (or not ours)."""
    ours = [is_our_process(pid, marker) for pid, marker in processes]
    for (pid, _), mine in zip(processes, ours, strict=True):
        if mine:
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for (pid, marker), mine in zip(processes, ours, strict=True):
        if mine and not wait_gone(pid, max(0.0, deadline - time.monotonic())):
            os.kill(pid, signal.SIGKILL)
            if not wait_gone(pid, 5.0):
                raise RuntimeError(f"process {pid} ({marker}) survived SIGKILL")
    return ours


def pid_running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie (an orphan may wait a while for init to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if not Path("/proc/self/stat").exists():
        return True  # no /proc (macOS): kill(0) is all we have
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    state = stat_line.rsplit(")", 1)[1].split()[0]
    return state not in ("Z", "X")


def is_our_process(pid: int, marker: str) -> bool:
    """True if `pid` runs and its command line names `marker`, so a recycled PID is never taken for ours."""
    if not pid_running(pid):
        return False
    if not Path("/proc/self/cmdline").exists():
        return True  # no /proc (macOS): trust the recorded PID
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False
    return marker in cmdline.replace(b"\0", b" ").decode(errors="replace")


def wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while pid_running(pid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def as_int(value: object) -> int | None:
    if isinstance(value, int):
        return value
    return int(value) if isinstance(value, str) and value.isdigit() else None


def read_json(path: Path) -> dict[str, object] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def write_json(path: Path, data: dict[str, object]) -> None:
    """Replace `path` atomically; readable by its owner only (a secure stack's URLs hold passwords)."""
    staging = path.with_suffix(".tmp")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(data))
    staging.replace(path)


def failure(what: str, log_path: Path | None) -> RuntimeError:
    if log_path is None:
        return RuntimeError(what)
    return RuntimeError(f"{what}\n--- end of {log_path} ---\n{log_tail(log_path)}")


def log_tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_CHARS))
            text = log.read().decode(errors="replace").strip()
    except OSError as exc:
        return f"(log unreadable: {exc.strerror})"
    return text or "(log is empty)"
