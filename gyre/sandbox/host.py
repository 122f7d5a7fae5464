"""Create, run, kill and release sandboxes on this host (shell: mounts, users, cgroups, processes).

Layout of one sandbox (a size-limited tmpfs when the kernel allows it, so the quota covers all):

    <root>/<name>/        root 0711
        work/             the workspace, sandbox uid 0700 (what gets graded)
        home/             $HOME of the harness, sandbox uid 0700
        tmp/              the sandbox's /tmp, /var/tmp and /dev/shm
        etc/              root: the passwd and group files the sandbox sees
        forward/          root 0711: the forwarder's Unix socket (the one way out)
        log/              root 0700: harness.log (its stdout+stderr), sandbox.log (set-up's own),
                          started.json (set-up's report), outcome.json (the end): all written by
                          the keeper from pipes it alone reads, each bounded

With namespaces, a process inside sees only the minimal root of `gyre.sandbox.rootfs`, started
by bubblewrap as the sandbox user; without them (not root, or no bwrap) it runs on the host
under rlimits only, and `Isolation.fallbacks` says what that leaves open. The workspace is kept
after the process ends (timeouts earn partial credit); `release` wipes it, the user and the
cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from gyre.errors import InvalidArgument
from gyre.sandbox import launcher
from gyre.sandbox.cgroups import cgroup_pids, make_cgroups, remove_cgroup
from gyre.sandbox.keeper import (
    KEEPER_FILE,
    OUTCOME_FILE,
    STARTED_FILE,
    ForwardStats,
    kill_keeper,
    read_tail,
    start_time,
)
from gyre.sandbox.limits import Isolation, SandboxLimits, disk_over_quota, plan_isolation
from gyre.sandbox.probe import probe
from gyre.sandbox.rootfs import FORWARD_DIR
from gyre.sandbox.roots import usable_root
from gyre.sandbox.trees import chown_tree, folder_bytes, remove_tree

log = structlog.get_logger(__name__)
WATCH_S = 0.5
KILL_WAIT_S = 10.0
USERADD_UID_TAKEN, USERADD_NAME_TAKEN = 4, 9


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How a sandboxed process ended."""

    exit_code: int | None
    """Exit code (128+signal when killed by a signal); None when the host killed it."""
    killed: str = ""
    """Why the host killed it: `deadline`, `disk_quota`, `cancelled`; empty when it exited."""
    duration_s: float = 0.0
    started: bool = False
    """The keeper's record that set-up finished and the process began (init's report on a pipe
    only the host reads, made before the process ran): the one fact `gyre.sandbox.blame` trusts."""
    setup_errno: int = 0
    setup_error: str = ""
    """Why set-up failed, as reported on that pipe (or that it ended without reporting)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Forward:
    """The one network destination a sandbox may reach: 127.0.0.1:listen_port -> host:port."""

    host: str
    port: int
    listen_port: int = 18080


class SandboxHost:
    """Hands out sandboxes under `root` with uids from `uid_base` upwards."""

    def __init__(
        self,
        root: Path,
        *,
        mode: str = "auto",
        uid_base: int = 62000,
        uid_count: int = 1000,
        runtime: Sequence[str] = (),
    ):
        self.runtime = tuple(
            sorted({sys.base_prefix, sys.prefix, *(str(Path(r).resolve()) for r in runtime)})
        )
        """Read-only inside at the same path: the Python installation and what the caller adds
        (a harness's own files); nothing else of the host's folders is there."""
        self.root = usable_root(Path(root))
        self.caps = probe()
        self.isolation: Isolation = plan_isolation(self.caps, mode=mode)
        self.uid_base = uid_base
        self.uid_count = uid_count
        self._uids_in_use: set[int] = set()
        self._lock = asyncio.Lock()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)

    async def create(self, name: str, limits: SandboxLimits) -> Sandbox:
        limits.validate()
        if not name or "/" in name or name.startswith("."):
            raise InvalidArgument("sandbox name", f"must be a plain folder name, got {name!r}")
        path = self.root / name
        if path.exists():
            raise InvalidArgument("sandbox name", f"{path} exists already")
        async with self._lock:
            uid, gid, user = await asyncio.to_thread(self._allocate_user)
        box = Sandbox(host=self, name=name, path=path, limits=limits, uid=uid, gid=gid, user=user)
        preparing = asyncio.ensure_future(asyncio.to_thread(box.prepare))
        try:
            await asyncio.shield(preparing)
        except BaseException:
            # Cancelled (a stopping runner) while the thread mounts: let it finish first, or the
            # release below runs beside it and the mount it makes afterwards outlives the sandbox.
            with contextlib.suppress(BaseException):
                await preparing
            await box.release()
            raise
        return box

    def sweep(self, *, keep: frozenset[str] = frozenset()) -> int:
        """Release every sandbox under the root but those named in `keep`, this process's or a
        crashed one's (tests, `gyre` operators, a restarted runner): kill what runs in it,
        unmount, remove cgroups and users, delete folders. Returns how many."""
        count = 0
        for path in sorted(p for p in self.root.iterdir() if p.is_dir() and p.name not in keep):
            kill_keeper(path / "log" / KEEPER_FILE)
            owner = (path / "work").stat().st_uid if (path / "work").exists() else 0
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                remove_tree(path)
            for base in (self.caps.cgroup_memory, self.caps.cgroup_pids, self.caps.cgroup_cpu):
                if base:
                    remove_cgroup(Path(base) / f"gyre-{path.name}")
            if self.uid_base <= owner < self.uid_base + self.uid_count:
                with contextlib.suppress(KeyError):
                    self._free_user(owner, pwd.getpwuid(owner).pw_name)
            count += 1
        return count

    def _allocate_user(self) -> tuple[int | None, int | None, str]:
        if not self.isolation.own_user:
            return None, None, ""
        for uid in range(self.uid_base, self.uid_base + self.uid_count):
            if uid in self._uids_in_use:
                continue
            try:
                pwd.getpwuid(uid)
                continue  # taken by someone else (or a sandbox not released)
            except KeyError:
                pass
            user = f"gyre{uid}"
            if self.caps.useradd:
                argv = ["useradd", "--no-create-home", "--user-group", "--uid", str(uid)]
                argv += ["--shell", "/usr/sbin/nologin", user]
                made = subprocess.run(argv, capture_output=True, timeout=30, check=False)
                if made.returncode in (USERADD_UID_TAKEN, USERADD_NAME_TAKEN):
                    continue  # another process (a parallel runner) took it since the look-up
                if made.returncode != 0:
                    raise OSError(f"useradd {user} failed: {made.stderr.decode(errors='replace').strip()}")
                gid = pwd.getpwnam(user).pw_gid
            else:
                user, gid = "", uid  # a bare uid works for setuid without a passwd entry
            self._uids_in_use.add(uid)
            return uid, gid, user
        raise InvalidArgument(
            "sandbox", f"no free uid in {self.uid_base}..{self.uid_base + self.uid_count - 1}"
        )

    def _free_user(self, uid: int | None, user: str) -> None:
        if uid is None:
            return
        if user:
            subprocess.run(["userdel", user], capture_output=True, timeout=30, check=False)
        self._uids_in_use.discard(uid)


class Sandbox:
    def __init__(
        self,
        *,
        host: SandboxHost,
        name: str,
        path: Path,
        limits: SandboxLimits,
        uid: int | None,
        gid: int | None,
        user: str,
    ):
        self.host = host
        self.name = name
        self.path = path
        self.limits = limits
        self.uid = uid
        self.gid = gid
        self.user = user
        self.isolation = host.isolation
        self.mounted = False
        self.released = False
        self.cgroups: list[Path] = []
        self.proc: asyncio.subprocess.Process | None = None
        """The keeper (`gyre.sandbox.keeper`) this process started; None for an adopted sandbox."""
        self.keeper: tuple[int, int | None] | None = None
        """(pid, start time) of the keeper, whoever started it."""
        self.forwarder: ForwardStats | None = None
        self._kill_reason = ""

    @property
    def work(self) -> Path:
        return self.path / "work"

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def log_path(self) -> Path:
        return self.path / "log" / "harness.log"

    def prepare(self) -> None:
        self.path.mkdir(mode=0o711)
        if self.isolation.tmpfs_quota:
            self.mounted = True  # before the attempt: a mount that timed out may still have happened
            subprocess.run(
                [
                    "mount",
                    "-t",
                    "tmpfs",
                    "-o",
                    f"size={self.limits.disk_mb}m,mode=0711,nosuid,nodev",
                    f"gyre-{self.name}",
                    str(self.path),
                ],
                check=True,
                capture_output=True,
                timeout=30,
            )
        for sub in ("work", "home", "tmp", "log"):
            d = self.path / sub
            d.mkdir(exist_ok=True)
            os.chmod(d, 0o700)
            if sub != "log" and self.uid is not None:
                os.chown(d, self.uid, self.gid if self.gid is not None else self.uid)
        if self.isolation.cgroups:
            make_cgroups(self.host.caps, f"gyre-{self.name}", self.limits, made=self.cgroups)

    def own_files(self) -> None:
        """Give everything in work/ and home/ to the sandbox user, folders 0700 at the top (after
        the host filled them): another sandbox's user can read nothing of it."""
        if self.uid is None:
            return
        gid = self.gid if self.gid is not None else self.uid
        for top in (self.work, self.home):
            chown_tree(top, self.uid, gid)
            os.chmod(top, 0o700)

    async def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        forward: Forward | None = None,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
        read_only: Sequence[Path] = (),
        stdout_fd: int | None = None,
        as_first_process: bool = False,
    ) -> None:
        """Start argv as the sandbox user; `pass_fds` (e.g. a pipe's write end whose read end only
        the host holds) are inherited at the same numbers; `stdout_fd`: such a pipe as its stdout
        instead of the log (its stderr still goes to the log); `read_only`: host-written folders
        of this sandbox (the grader's files) the process may read but not change.
        `as_first_process` (with namespaces, no forward): argv replaces the sandbox's first process
        (`init._become`), so the programs it starts cannot signal it; pair it with a program the
        sandbox user cannot read, so that they cannot read it either."""
        if self.keeper is not None:
            raise RuntimeError(f"sandbox {self.name} already ran a process")
        spec: dict[str, object] = {
            "argv": list(argv),
            "env": {"HOME": str(self.home), "TMPDIR": "/tmp", "PATH": os.defpath, **env},
            "cwd": str(cwd or self.work),
            "uid": self.uid,
            "gid": self.gid,
            "rlimits": self.limits.rlimits(),
            "namespaces": self.isolation.namespaces,
            "pass_fds": list(pass_fds),
            "stdout_fd": stdout_fd,
            "as_first_process": as_first_process,
        }
        own_fds: list[int] = []  # closed here once the keeper holds them (or on failure)
        caller_fds = [*pass_fds, *([stdout_fd] if stdout_fd is not None else [])]
        keeper: dict[str, object] = {"log_dir": str(self.path / "log"), "forward": None}
        try:
            if self.isolation.namespaces:
                if forward is not None:
                    self.forwarder = ForwardStats(folder=self.path / "forward")
                    keeper["forward"] = {
                        "folder": str(self.forwarder.folder),
                        "host": forward.host,
                        "port": forward.port,
                        "max_connections": self.limits.max_connections,
                        "uid": self.uid,
                    }
                    spec["forward"] = {
                        "listen_port": forward.listen_port,
                        "socket_path": f"{FORWARD_DIR}/proxy.sock",
                    }
                seccomp_fd = launcher.seccomp_fd(self)
                if seccomp_fd is not None:
                    own_fds.append(seccomp_fd)
                cmd, staging = launcher.bwrap_command(
                    self, cwd or self.work, read_only=read_only, seccomp_fd=seccomp_fd, fds=own_fds
                )
            else:
                spec["cgroup_procs"] = [str(d / "cgroup.procs") for d in self.cgroups]
                cmd, staging = [sys.executable, "-I", "-S", str(launcher.INIT_SCRIPT)], ""
            keeper.update(
                cmd=cmd,
                init=spec,
                pass_fds=[*own_fds, *caller_fds],
                env={
                    "PATH": os.environ.get("PATH", os.defpath),
                    "GYRE_CGROUP_PROCS": " ".join(str(d / "cgroup.procs") for d in self.cgroups),
                    "GYRE_STAGE": staging,
                },
            )
            with self._open_setup_log() as setup_log:
                self.proc = await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "gyre.sandbox.keeper",
                    stdin=asyncio.subprocess.PIPE,
                    stdout=setup_log,
                    stderr=setup_log,
                    start_new_session=True,  # not in the runner's group: a signal to it misses the keeper
                    pass_fds=(*own_fds, *caller_fds),
                )
        finally:
            for fd in own_fds:
                os.close(fd)
        self.keeper = (self.proc.pid, None)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(keeper).encode())
        await self.proc.stdin.drain()
        self.proc.stdin.close()

    def _open_setup_log(self) -> BinaryIO:
        return (self.path / "log" / "sandbox.log").open("ab")

    def base_url(self, forward: Forward) -> str:
        """The proxy as the process inside sees it."""
        if self.isolation.namespaces:
            return f"http://127.0.0.1:{forward.listen_port}"
        return f"http://{forward.host}:{forward.port}"

    async def wait(self, *, timeout_s: float) -> Outcome:
        """Wait for the process; kill the whole sandbox at the deadline or past the disk quota."""
        assert self.keeper is not None, "launch (or adopt) first"
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                await self.kill("deadline")
                break
            if await self._ended(within_s=min(WATCH_S, left)):
                break
            if not self.isolation.tmpfs_quota and disk_over_quota(
                await asyncio.to_thread(folder_bytes, self.path), disk_mb=self.limits.disk_mb
            ):
                await self.kill("disk_quota")
                break
        duration = time.monotonic() - started
        setup = self._read_json(STARTED_FILE) or {}
        base = Outcome(
            exit_code=None,
            duration_s=duration,
            started=setup.get("started") is True,
            setup_errno=int(setup.get("setup_errno") or 0),
            setup_error=str(setup.get("setup_error") or ""),
        )
        if self._kill_reason:
            return dataclasses.replace(base, killed=self._kill_reason)
        ended = self._read_json(OUTCOME_FILE)
        if ended is not None:
            forward = ended.get("forward") or {}
            if self.forwarder is not None and forward:
                self.forwarder = ForwardStats(folder=self.forwarder.folder, **forward)
            return dataclasses.replace(base, exit_code=ended["exit_code"])
        if self.proc is not None and self.proc.returncode not in (None, 0):
            return dataclasses.replace(base, exit_code=self.proc.returncode)  # the keeper died
        return dataclasses.replace(base, killed="keeper_lost")

    async def _ended(self, *, within_s: float) -> bool:
        if self.proc is not None:
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=within_s)
                return True
            except TimeoutError:
                return False
        if (self.path / "log" / OUTCOME_FILE).exists() or not self.keeper_alive():
            return True
        await asyncio.sleep(within_s)
        return False

    def keeper_alive(self) -> bool:
        if self.keeper is None:
            return False
        if self.proc is not None:
            return self.proc.returncode is None
        pid, started = self.keeper
        return pid > 0 and started is not None and start_time(pid) == started

    def _read_json(self, name: str) -> dict[str, Any] | None:
        """A record the keeper wrote in log/ (root-only: nothing in the sandbox reaches it)."""
        try:
            data: dict[str, Any] = json.loads((self.path / "log" / name).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    async def log_tail(self, limit: int = 2000, *, name: str = "harness.log") -> str:
        """The last `limit` bytes of a log of this sandbox, read off the event loop."""
        return await asyncio.to_thread(read_tail, self.path / "log" / name, limit)

    async def kill(self, reason: str) -> None:
        """Kill every process of the sandbox: pid namespace, cgroups, and everything of its uid."""
        if self.keeper is None or not self.keeper_alive():
            return
        self._kill_reason = self._kill_reason or reason
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.keeper[0], signal.SIGKILL)  # keeper, bwrap (--die-with-parent) or init
        await asyncio.to_thread(self._kill_leftovers)
        for _ in range(int(KILL_WAIT_S / 0.05)):  # bounded: SIGKILLed processes exit in moments
            if not self.keeper_alive():
                break
            if self.proc is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.proc.wait(), timeout=0.05)
            else:
                await asyncio.sleep(0.05)
        for _ in range(int(KILL_WAIT_S / 0.05)):  # bounded: SIGKILLed processes exit in moments
            if not any(cgroup_pids(d) for d in self.cgroups):
                break
            await asyncio.sleep(0.05)

    def _kill_leftovers(self) -> None:
        for d in self.cgroups:
            for pid in cgroup_pids(d):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if self.uid is not None:  # kill(-1) as the sandbox uid reaches exactly its processes
            launcher.kill_all_of_uid(self.uid, self.gid if self.gid is not None else self.uid)

    async def release(self) -> None:
        """Remove the folder, the cgroups and the user; the workspace is gone afterwards."""
        await self.kill("released")
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        if self.released:  # a second release must not free a uid another sandbox took since
            return
        self.released = True
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30, check=False)
            self.mounted = False
        try:
            remove_tree(self.path)  # the workspace is wiped: nothing of it is left for a later uid
        except (OSError, subprocess.SubprocessError) as exc:
            log.warning("sandbox_not_removed", path=str(self.path), error=str(exc))
        for d in self.cgroups:
            remove_cgroup(d)
        self.cgroups = []
        self.host._free_user(self.uid, self.user)
