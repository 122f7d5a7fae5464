"""Create, run, kill and release sandboxes on this host (shell: mounts, users, cgroups, processes).

Layout of one sandbox (a size-limited tmpfs when the kernel allows it, so the quota covers all):

    <root>/<name>/        root 0711
        work/             the workspace, sandbox uid 0700 (what gets graded)
        home/             $HOME of the harness, sandbox uid 0700
        tmp/              bind-mounted over /tmp, /var/tmp, /dev/shm, /run/lock inside
        log/              root 0700: harness.log (its stdout+stderr), sandbox.log (pid 1's own)

The workspace is kept after the process ends (timeouts earn partial credit); `release` removes
it, the user and the cgroups.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import structlog

from gyre.errors import InvalidArgument
from gyre.sandbox.limits import MIB, Isolation, SandboxLimits, disk_over_quota, plan_isolation
from gyre.sandbox.probe import probe

log = structlog.get_logger(__name__)
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
# The code harnesses import (the built-in agent, installed editable) stays visible in a sandbox
# even when the checkout lies under a covered folder (/tmp, /root).
PROJECT_ROOT = Path(__file__).resolve().parents[2]
RELOCATED_ROOTS = Path("/var/lib/gyre/sandboxes")
WATCH_S = 0.5
HIDDEN = ("/root", "/home")
"""Covered by an empty folder inside; paths the harness needs below them are mounted back."""
KILL_WAIT_S = 10.0


def usable_root(root: Path) -> Path:
    """`root`, or where its sandboxes live instead when it lies in a shared temp folder.

    Every sandbox gets private temp folders, which cover the shared ones inside it, and /root and
    /home are covered too, so a sandbox kept there could not see its own workspace. A checkout (or
    a test's folder) in those places is common, so as root such a root moves to
    /var/lib/gyre/sandboxes/<name>-<hash of the path>: the same path always maps to the same
    place, so sweeping a crashed run's leftovers still works.
    """
    root = root.resolve()
    if not any(root == Path(t) or root.is_relative_to(t) for t in (*SHARED_TEMP, *HIDDEN)):
        return root
    if os.geteuid() != 0:
        raise InvalidArgument(
            "sandbox_root", f"must not lie under a shared temp or home folder (covered inside), got {root}"
        )
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    relocated = RELOCATED_ROOTS / f"{root.name}-{tag}"
    log.info("sandbox_root_relocated", asked=str(root), used=str(relocated))
    return relocated


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """How a sandboxed process ended."""

    exit_code: int | None
    """Exit code (128+signal when killed by a signal); None when the host killed it."""
    killed: str = ""
    """Why the host killed it: `deadline`, `disk_quota`, `cancelled`; empty when it exited."""
    duration_s: float = 0.0


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
        hide: tuple[str, ...] = (),
    ):
        self.hide = tuple(str(Path(h).resolve()) for h in hide)
        """More folders covered by an empty one inside (e.g. the task set with its hidden tests)."""
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
        try:
            await asyncio.to_thread(box.prepare)
        except BaseException:
            await box.release()
            raise
        return box

    def sweep(self) -> int:
        """Release every sandbox under the root, this process's or a crashed one's (tests, `gyre`
        operators): unmount, remove cgroups and users, delete folders. Returns how many."""
        count = 0
        for path in sorted(p for p in self.root.iterdir() if p.is_dir()):
            owner = (path / "work").stat().st_uid if (path / "work").exists() else 0
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30, check=False)
            shutil.rmtree(path, ignore_errors=True)
            for base in (self.caps.cgroup_memory, self.caps.cgroup_pids):
                if base:
                    with contextlib.suppress(OSError):
                        (Path(base) / f"gyre-{path.name}").rmdir()
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
                subprocess.run(
                    [
                        "useradd",
                        "--no-create-home",
                        "--user-group",
                        "--uid",
                        str(uid),
                        "--shell",
                        "/usr/sbin/nologin",
                        user,
                    ],
                    check=True,
                    capture_output=True,
                    timeout=30,
                )
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
        self.cgroups: list[Path] = []
        self.proc: asyncio.subprocess.Process | None = None
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
            self.mounted = True
        for sub, owner_mode in (("work", 0o700), ("home", 0o700), ("tmp", 0o700), ("log", 0o700)):
            d = self.path / sub
            d.mkdir(exist_ok=True)
            os.chmod(d, owner_mode)
            if sub != "log" and self.uid is not None:
                os.chown(d, self.uid, self.gid if self.gid is not None else self.uid)
        if self.isolation.cgroups:
            self._make_cgroups()

    def _make_cgroups(self) -> None:
        mem = Path(self.host.caps.cgroup_memory) / f"gyre-{self.name}"
        pids = Path(self.host.caps.cgroup_pids) / f"gyre-{self.name}"
        for d in (mem, pids):
            d.mkdir(exist_ok=True)
            self.cgroups.append(d)
        (mem / "memory.limit_in_bytes").write_text(str(self.limits.memory_mb * MIB))
        with contextlib.suppress(OSError):  # without swap accounting the file is missing
            (mem / "memory.memsw.limit_in_bytes").write_text(str(self.limits.memory_mb * MIB))
        (pids / "pids.max").write_text(str(self.limits.max_procs + 8))  # +8: pid 1 and its helpers

    def own_files(self) -> None:
        """Give everything in work/ and home/ to the sandbox user (after the host filled them)."""
        if self.uid is None:
            return
        gid = self.gid if self.gid is not None else self.uid
        for top in (self.work, self.home):
            for dirpath, dirnames, filenames in os.walk(top):
                os.lchown(dirpath, self.uid, gid)
                for n in dirnames + filenames:
                    os.lchown(os.path.join(dirpath, n), self.uid, gid)

    async def launch(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        forward: Forward | None = None,
        cwd: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> None:
        """Start argv as the sandbox user; `pass_fds` (e.g. a pipe's write end whose read end only
        the host holds) are inherited at the same numbers through unshare and pid 1."""
        if self.proc is not None:
            raise RuntimeError(f"sandbox {self.name} already ran a process")
        spec = {
            "argv": list(argv),
            "env": {"HOME": str(self.home), "TMPDIR": "/tmp", "PATH": os.defpath, **env},
            "cwd": str(cwd or self.work),
            "uid": self.uid,
            "gid": self.gid,
            "rlimits": self.limits.rlimits(),
            "namespaces": self.isolation.namespaces,
            "private_tmp": str(self.path / "tmp"),
            "forward": None
            if forward is None or not self.isolation.namespaces
            else {
                "host": forward.host,
                "port": forward.port,
                "listen_port": forward.listen_port,
            },
            "log_path": str(self.log_path),
            "hide": [*HIDDEN, *self.host.hide],
            "expose": sorted({sys.base_prefix, sys.prefix, str(PROJECT_ROOT)}),
            "stage": str(self.path / "log" / "stage"),
            "cgroup_procs": [str(d / "cgroup.procs") for d in self.cgroups],
            "pass_fds": list(pass_fds),
        }
        init = [sys.executable, "-m", "gyre.sandbox.init"]
        cmd = (
            ["unshare", "--pid", "--mount", "--fork", "--kill-child", *init]
            if self.isolation.namespaces
            else init
        )
        setup_log = self._open_setup_log()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *cmd,
                stdin=asyncio.subprocess.PIPE,
                stdout=setup_log,
                stderr=setup_log,
                start_new_session=True,
                pass_fds=tuple(pass_fds),
                env={
                    "PATH": os.environ.get("PATH", os.defpath),
                    "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                },
            )
        finally:
            setup_log.close()
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(spec).encode())
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
        assert self.proc is not None, "launch first"
        started = time.monotonic()
        deadline = started + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                await self.kill("deadline")
                break
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=min(WATCH_S, left))
                break
            except TimeoutError:
                pass
            if not self.isolation.tmpfs_quota and disk_over_quota(
                await asyncio.to_thread(folder_bytes, self.path), disk_mb=self.limits.disk_mb
            ):
                await self.kill("disk_quota")
                break
        duration = time.monotonic() - started
        if self._kill_reason:
            return Outcome(exit_code=None, killed=self._kill_reason, duration_s=duration)
        code = self.proc.returncode
        return Outcome(exit_code=code, duration_s=duration)

    async def kill(self, reason: str) -> None:
        """Kill every process of the sandbox: pid namespace, cgroups, and everything of its uid."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self._kill_reason = self._kill_reason or reason
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # unshare (--kill-child takes pid 1 along) or init
        await asyncio.to_thread(self._kill_leftovers)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), timeout=KILL_WAIT_S)

    def _kill_leftovers(self) -> None:
        for d in self.cgroups:
            with contextlib.suppress(OSError):
                for pid in (d / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
        if self.uid is not None:  # kill(-1) as the sandbox uid reaches exactly its processes
            kill_all_of_uid(self.uid, self.gid if self.gid is not None else self.uid)

    async def release(self) -> None:
        """Remove the folder, the cgroups and the user; the workspace is gone afterwards."""
        if self.proc is not None and self.proc.returncode is None:
            await self.kill("released")
        await asyncio.to_thread(self._release)

    def _release(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True, timeout=30, check=False)
            self.mounted = False
        shutil.rmtree(self.path, ignore_errors=True)
        for d in self.cgroups:
            with contextlib.suppress(OSError):
                d.rmdir()
        self.cgroups = []
        self.host._free_user(self.uid, self.user)


def folder_bytes(path: Path, *, max_entries: int = 1_000_000) -> int:
    """Bytes under `path` (allocated blocks, links not followed); bounded number of entries."""
    total = 0
    seen = 0
    stack = [str(path)]
    while stack and seen < max_entries:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                for entry in it:
                    seen += 1
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    total += st.st_blocks * 512
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
        except OSError:
            continue
    return total


def kill_all_of_uid(uid: int, gid: int) -> None:
    """SIGKILL every process of `uid`: `kill -KILL -1` run as that uid reaches exactly those.

    The uid is switched by `setpriv` after exec, so Python spawns with vfork: a plain fork in a
    process with gRPC threads runs gRPC's fork handlers in the child, which can crash it before
    the exec (seen under load). Without setpriv, subprocess switches the uid in C (fork).
    """
    kill = shutil.which("kill", path="/usr/bin:/bin")
    if kill is None:
        log.warning("no_kill_binary", uid=uid)
        return
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin")
    if setpriv is not None:
        argv = [setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", kill, "-KILL", "-1"]
        subprocess.run(argv, capture_output=True, timeout=30, check=False)
        return
    subprocess.run(
        [kill, "-KILL", "-1"],
        user=uid,
        group=gid,
        extra_groups=[],
        capture_output=True,
        timeout=30,
        check=False,
    )
