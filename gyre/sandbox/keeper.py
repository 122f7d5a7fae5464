"""The sandbox's keeper: the host process that owns one sandbox's launch and outlives its runner
(shell: processes, a Unix socket, files).

`Sandbox.launch` starts `python -m gyre.sandbox.keeper` in a session of its own and writes it a
JSON spec on stdin. The keeper serves the sandbox's forwarder (`gyre.sandbox.forward`: the one
way to the proxy), starts the launcher command (root launcher -> setpriv -> bwrap -> `init.py`)
as its own child, hands it the init spec, waits for it and writes how it ended to
`outcome_path`, atomically, before it exits. bwrap's `--die-with-parent` therefore binds the
sandbox to the keeper, not to the runner: a runner killed with -9 leaves the harness running
and still connected, and a restarted runner finds it again from the files the keeper leaves
(`keeper.json`: its pid and start time; `outcome.json`: the end), see `gyre.sandbox.adopt`.
Killing the keeper's process group takes the whole sandbox down, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.sandbox.forward import Forwarder

KEEPER_FILE = "keeper.json"
OUTCOME_FILE = "outcome.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class ForwardStats:
    """A sandbox's forwarder (served by its keeper): its folder, and its counters once it ended."""

    folder: Path
    peak: int = 0
    """Most connections open at once (what `max_connections` bounds)."""
    accepted: int = 0
    refused: int = 0


def read_keeper(keeper_file: Path) -> tuple[int, int | None] | None:
    """(pid, start time) a keeper recorded, or None when it left no readable file."""
    try:
        keeper = json.loads(keeper_file.read_text())
        return int(keeper["pid"]), keeper.get("start_time")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def kill_keeper(keeper_file: Path) -> None:
    """Kill a keeper (and with it its sandbox) when that very process still runs."""
    keeper = read_keeper(keeper_file)
    if keeper is not None and keeper[0] > 0 and keeper[1] is not None and start_time(keeper[0]) == keeper[1]:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(keeper[0], signal.SIGKILL)


def write_atomically(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart); None if gone.

    Example: start_time(os.getpid()) -> 123456 (field 22 of /proc/<pid>/stat)
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):  # exited, not reaped yet
        return None
    return int(fields[19])


async def keep(spec: dict[str, Any]) -> int:
    log_dir = Path(spec["log_dir"])
    write_atomically(log_dir / KEEPER_FILE, {"pid": os.getpid(), "start_time": start_time(os.getpid())})
    forwarder = None
    if spec.get("forward"):
        f = spec["forward"]
        forwarder = Forwarder(
            folder=Path(f["folder"]),
            host=f["host"],
            port=f["port"],
            max_connections=f["max_connections"],
            uid=f["uid"],
        )
        await forwarder.start()
    pass_fds = [int(fd) for fd in spec["pass_fds"]]
    with (log_dir / "sandbox.log").open("ab") as setup_log:
        proc = await asyncio.create_subprocess_exec(
            *spec["cmd"],
            stdin=asyncio.subprocess.PIPE,
            stdout=setup_log,
            stderr=setup_log,
            pass_fds=pass_fds,
            env=spec["env"],
        )
    for fd in pass_fds:  # the launcher holds them now
        os.close(fd)
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(spec["init"]).encode())
    await proc.stdin.drain()
    proc.stdin.close()
    code = await proc.wait()
    forward = {}
    if forwarder is not None:
        forward = {"peak": forwarder.peak, "accepted": forwarder.accepted, "refused": forwarder.refused}
        await forwarder.close()
    write_atomically(log_dir / OUTCOME_FILE, {"exit_code": code, "forward": forward})
    return 0


def main() -> int:
    spec = json.loads(sys.stdin.read())
    return asyncio.run(keep(spec))


if __name__ == "__main__":
    sys.exit(main())
