"""Probe what the kernel lets this process do for sandboxes (shell: runs commands, touches /sys)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gyre.sandbox.limits import Capabilities

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _quiet(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _cgroup_v1_dir(controller: str) -> str:
    """This process's cgroup-v1 folder for `controller`, if a child can be created in it."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controller in controllers.split(","):
            base = CGROUP_ROOT / controller / rel.lstrip("/")
            probe = base / f"gyre-probe-{os.getpid()}"
            try:
                probe.mkdir()
                probe.rmdir()
            except OSError:
                return ""
            return str(base)
    return ""


def _tmpfs_mountable() -> bool:
    with tempfile.TemporaryDirectory(prefix="gyre-probe-") as d:
        if not _quiet(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", d]):
            return False
        return _quiet(["umount", d])


@functools.cache
def probe() -> Capabilities:
    root = os.geteuid() == 0
    unshare = shutil.which("unshare")
    namespaces = bool(
        root and unshare and _quiet([unshare, "--pid", "--mount", "--net", "--fork", "--kill-child", "true"])
    )
    return Capabilities(
        root=root,
        namespaces=namespaces,
        tmpfs=root and _tmpfs_mountable(),
        cgroup_memory=_cgroup_v1_dir("memory") if root else "",
        cgroup_pids=_cgroup_v1_dir("pids") if root else "",
        useradd=root and shutil.which("useradd") is not None,
    )
