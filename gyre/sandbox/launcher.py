"""Start and stop a sandbox's processes on the host (shell: commands, descriptors, signals).

`bwrap_command` builds what `Sandbox.launch` runs: the root launcher (`LAUNCHER`: cgroups, the
runtime staged where the sandbox user can reach it) that becomes setpriv -> bwrap -> the
sandbox's first process (`init.py`) inside the minimal root of `rootfs`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from gyre.sandbox.rootfs import (
    ETC_FILES,
    FORWARD_DIR,
    INIT_PATH,
    TOP_LEVEL,
    RootPlan,
    bwrap_argv,
    passwd_text,
)
from gyre.sandbox.seccomp import program_for

if TYPE_CHECKING:
    from gyre.sandbox.host import Sandbox

log = structlog.get_logger(__name__)
INIT_SCRIPT = Path(__file__).resolve().with_name("init.py")
LAUNCHER = r"""
for f in $GYRE_CGROUP_PROCS; do echo 0 > "$f" || exit 125; done
printf '%s' "$GYRE_STAGE" | while IFS="$(printf '\t')" read -r src dst; do
    mount --bind "$src" "$dst" && mount -o remount,bind,ro "$dst" || exit 125
done || exit 125
unset GYRE_CGROUP_PROCS GYRE_STAGE
exec "$@"
"""
"""Runs as root in a mount namespace of its own (`unshare --mount`): joins the sandbox's cgroups
(`0`: the writer itself, so every process of the sandbox starts inside them), binds the runtime
folders where the sandbox user can reach them (the Python installation may sit under /root,
which that user cannot enter), then becomes setpriv -> bwrap as the sandbox user. The staging
mounts die with that namespace; the host's mount table never sees them."""


def seccomp_fd(box: Sandbox) -> int | None:
    program = program_for(os.uname().machine)
    if program is None:
        return None
    path = box.path / "log" / "seccomp.bpf"
    path.write_bytes(program)
    return os.open(path, os.O_RDONLY)


def bwrap_command(
    box: Sandbox, cwd: Path, *, read_only: Sequence[Path], seccomp_fd: int | None, fds: list[int]
) -> tuple[list[str], str]:
    """The launcher's command line and its staging list; the descriptors it needs are opened
    here and appended to `fds`."""

    def opened(path: Path) -> int:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        fds.append(fd)
        return fd

    uid = box.uid if box.uid is not None else os.geteuid()
    gid = box.gid if box.gid is not None else os.getegid()
    passwd, group = passwd_text(uid=uid, gid=gid, user=box.user, home=str(box.home))
    etc = box.path / "etc"
    etc.mkdir(mode=0o700, exist_ok=True)
    for name, text in (("passwd", passwd), ("group", group)):
        (etc / name).write_text(text)
    stage = box.path / "runtime"
    stage.mkdir(mode=0o711, exist_ok=True)
    runtime = [p for p in box.host.runtime if os.path.exists(p)]
    staged = box.uid is not None  # as root: bwrap runs as another user, who may not reach them
    for n, p in enumerate(runtime if staged else ()):  # mount points: a folder, or a file
        if os.path.isdir(p):
            (stage / str(n)).mkdir(mode=0o755, exist_ok=True)
        else:
            (stage / str(n)).touch(mode=0o644)
    extra = [(str(p), str(p)) for p in read_only]
    if box.forwarder is not None:
        extra.append((str(box.forwarder.folder), FORWARD_DIR))
    plan = RootPlan(
        bwrap=box.host.caps.bwrap,
        top_links={n: os.readlink(f"/{n}") for n in TOP_LEVEL if os.path.islink(f"/{n}")},
        top_dirs=[n for n in TOP_LEVEL if not os.path.islink(f"/{n}") and os.path.isdir(f"/{n}")],
        etc=[n for n in ETC_FILES if os.path.exists(f"/etc/{n}")],
        files=[
            (opened(etc / "passwd"), "/etc/passwd"),
            (opened(etc / "group"), "/etc/group"),
            (opened(INIT_SCRIPT), INIT_PATH),
        ],
        runtime=[(str(stage / str(n)) if staged else p, p) for n, p in enumerate(runtime)],
        read_write=[(str(box.work), str(box.work)), (str(box.home), str(box.home))],
        private_tmp=str(box.path / "tmp"),
        read_only=extra,
        seccomp_fd=seccomp_fd,
        cwd=str(cwd),
    )
    init = [sys.executable, "-I", "-S", INIT_PATH]
    drop = []
    if box.uid is not None:  # bwrap runs unprivileged, as the sandbox user, from the start
        drop = [box.host.caps.setpriv, f"--reuid={box.uid}", f"--regid={gid}", "--clear-groups"]
    staging = "".join(f"{p}\t{stage / str(n)}\n" for n, p in enumerate(runtime)) if staged else ""
    launcher = [box.host.caps.unshare, "--mount", "--propagation", "private"] if staged else []
    cmd = [*launcher, "/bin/sh", "-c", LAUNCHER, "gyre-sandbox", *drop, *bwrap_argv(plan, init)]
    return cmd, staging


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
