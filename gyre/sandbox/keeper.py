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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.sandbox.forward import Forwarder

KEEPER_FILE = "keeper.json"
OUTCOME_FILE = "outcome.json"
STARTED_FILE = "started.json"
"""How set-up ended, as init reported it on the status pipe (`setup_record`)."""
SETUP_LOG_LIMIT = 256 * 1024
LOG_LIMIT = 16 * 1024 * 1024
"""Bytes of the harness's output kept in harness.log (then its last 64 KiB); the runner reads
only the end of it."""
DRAIN_GRACE_S = 2.0
RESERVED_BYTES = 16 * 1024


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
    """Write the JSON beside `path` and rename it there. Where `reserve` made room for it first,
    the text goes into those pages: a sandbox that filled its disk quota (the log folder shares
    the sandbox's tmpfs) cannot keep the keeper from recording how it ended."""
    tmp = path.with_name(f".{path.name}.tmp")
    text = json.dumps(data).encode()
    if len(text) <= RESERVED_BYTES and tmp.exists():
        with tmp.open("r+b") as f:
            f.write(text)
            f.truncate()
    else:
        tmp.write_bytes(text)
    os.replace(tmp, path)


def reserve(path: Path) -> None:
    """Allocate the pages `write_atomically(path, ...)` will write into, before the sandbox runs."""
    path.with_name(f".{path.name}.tmp").write_bytes(b" " * RESERVED_BYTES)


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


class Drain:
    """Copies a pipe into a host file on a thread, at most `limit` bytes, then reads and drops the
    rest (counting it) so the writer never blocks; the last `TAIL` bytes dropped are appended at
    the end, so the file still shows how the output ended.

    The pipe's writers are sandboxed processes: a daemon thread, so a writer that never closes
    its end (a process left running outside a pid namespace) cannot keep the keeper alive.
    """

    TAIL = 64 * 1024

    def __init__(self, fd: int, path: Path | None, *, limit: int):
        self.fd = fd
        self.path = path
        self.limit = limit
        self.data = bytearray()
        """What was read, when `path` is None (the status pipe): the caller wants it whole."""
        self.dropped = 0
        self.tail = bytearray()
        self.done = threading.Event()
        self.line = threading.Event()
        """Set once a whole line was read (the status pipe's one line)."""
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        written = 0
        try:
            with open(os.devnull, "ab") if self.path is None else self.path.open("ab") as out:
                while chunk := os.read(self.fd, 65536):
                    keep = chunk[: max(0, self.limit - written)]
                    if keep:
                        with contextlib.suppress(OSError):  # a full quota: the rest is dropped
                            out.write(keep)
                            out.flush()
                        written += len(keep)
                        if self.path is None:  # kept only where nothing is written (the status)
                            self.data += keep
                            if b"\n" in keep:
                                self.line.set()
                    if len(keep) < len(chunk):
                        self.dropped += len(chunk) - len(keep)
                        self.tail = (self.tail + chunk[len(keep) :])[-self.TAIL :]
                if self.dropped:
                    with contextlib.suppress(OSError):
                        out.write(f"\n[gyre: {self.dropped} bytes of output dropped; the last ".encode())
                        out.write(f"{len(self.tail)} follow]\n".encode() + bytes(self.tail))
        finally:
            os.close(self.fd)
            self.done.set()

    async def wait(self, timeout_s: float) -> bool:
        return await asyncio.to_thread(self.done.wait, timeout_s)


def read_tail(path: Path, limit: int) -> str:
    """The last `limit` bytes of a log, however large it grew; "" when it cannot be read."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - limit))
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def setup_record(status: bytes) -> dict[str, Any]:
    """The keeper's record of how set-up ended, from the line init wrote on the status pipe (pure).

    Example:
        setup_record(b"started\n") -> {"started": True, "setup_errno": 0, "setup_error": ""}
        setup_record(b"failed 2 [Errno 2] No such file or directory: 'x'\n")
            -> {"started": False, "setup_errno": 2, "setup_error": "[Errno 2] No such file ..."}
        setup_record(b"") -> {"started": False, "setup_errno": 0, "setup_error": "set-up ended ..."}
    """
    line = status.decode(errors="replace").strip()
    if line == "started":
        return {"started": True, "setup_errno": 0, "setup_error": ""}
    word, _, rest = line.partition(" ")
    if word == "failed":
        number, _, message = rest.partition(" ")
        return {
            "started": False,
            "setup_errno": int(number) if number.isdigit() else 0,
            "setup_error": message[:2000],
        }
    return {
        "started": False,
        "setup_errno": 0,
        "setup_error": "set-up ended before it reported (bwrap or the sandbox's first process failed)",
    }


async def keep(spec: dict[str, Any]) -> int:
    log_dir = Path(spec["log_dir"])
    write_atomically(log_dir / KEEPER_FILE, {"pid": os.getpid(), "start_time": start_time(os.getpid())})
    for name in (STARTED_FILE, OUTCOME_FILE):
        reserve(log_dir / name)
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
    # Two pipes only this keeper reads: set-up's report (written by init before the harness runs,
    # then closed) and the harness's output. Host files are never a sandboxed process's stdout.
    status_read, status_write = os.pipe()
    output_read, output_write = os.pipe()
    setup_read, setup_write = os.pipe()
    init = {**spec["init"], "status_fd": status_write, "log_fd": output_write}
    pass_fds = [*(int(fd) for fd in spec["pass_fds"]), status_write, output_write]
    proc = await asyncio.create_subprocess_exec(
        *spec["cmd"],
        stdin=asyncio.subprocess.PIPE,
        stdout=setup_write,
        stderr=setup_write,
        pass_fds=pass_fds,
        env=spec["env"],
    )
    for fd in [*pass_fds, setup_write]:  # the launcher holds them now
        os.close(fd)
    assert proc.stdin is not None
    setup = Drain(setup_read, log_dir / "sandbox.log", limit=SETUP_LOG_LIMIT)
    status = Drain(status_read, None, limit=4096)
    output = Drain(output_read, log_dir / "harness.log", limit=int(spec.get("log_limit", LOG_LIMIT)))
    proc.stdin.write(json.dumps(init).encode())
    await proc.stdin.drain()
    proc.stdin.close()
    status_task = asyncio.ensure_future(_record_setup(status, log_dir))
    code = await proc.wait()
    await status.wait(DRAIN_GRACE_S)  # every writer is gone once the launcher ended (or soon after)
    record = await status_task
    for drain in (setup, output):
        await drain.wait(DRAIN_GRACE_S)
    forward = {}
    if forwarder is not None:
        forward = {"peak": forwarder.peak, "accepted": forwarder.accepted, "refused": forwarder.refused}
        await forwarder.close()
    write_atomically(log_dir / OUTCOME_FILE, {"exit_code": code, "forward": forward, **record})
    return 0


async def _record_setup(status: Drain, log_dir: Path) -> dict[str, Any]:
    """Write `started.json` as soon as init reported (before the harness could end): a host kill
    at the deadline takes the keeper down before it writes the outcome, and still finds this."""
    while not (status.line.is_set() or status.done.is_set()):
        await asyncio.to_thread(status.line.wait, 0.05)
    record = setup_record(bytes(status.data))
    write_atomically(log_dir / STARTED_FILE, record)
    return record


def main() -> int:
    spec = json.loads(sys.stdin.read())
    return asyncio.run(keep(spec))


if __name__ == "__main__":
    sys.exit(main())
