"""A hard disk limit for one container: its workdir on a loop-mounted ext4 of a fixed size (shell).

Overlay over ext4 cannot cap a container's writable layer, so a container with a workdir runs
with a read-only root and writes only to (a) this volume, bind-mounted at the workdir and filled
with the image's own workdir at create (so `git diff` against the base works as before), and
(b) sized tmpfs mounts (/tmp, /var/tmp, /dev/shm, the agent's folder), which live in the
container's memory, not on the host's disk. A write past the volume's size gets ENOSPC; what
reaches the host's disk is at most the image file's size.

Each disk is DISK_ROOT/<container>.img, mounted at DISK_ROOT/<container>/, with
DISK_ROOT/<container>.owner naming its owner (the container's `gyre.owner` label), so an owner
that restarts removes what it left (`sweep_disks`). The loop device is the kernel's autoclear
one (`mount -o loop`): it goes with the unmount.

Needs root, `mkfs.ext4` and `mount` (`disk_unsupported` says why not; the caller then falls back
to measuring the writable layer, the second line it keeps anyway).
"""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import structlog

from gyre.errors import Unavailable

log = structlog.get_logger(__name__)
DISK_ROOT = Path(os.environ.get("GYRE_DISK_ROOT", "/var/tmp/gyre-disks"))
SLACK_MB = 4
"""ext4's own blocks (inode tables, bitmaps; no journal) on top of the content and the quota."""
TOOL_TIMEOUT_S = 120.0


def disk_unsupported() -> str:
    """Why hard disk limits cannot be made here; "" when they can."""
    if os.geteuid() != 0:
        return "not root (loop mounts need root)"
    missing = [t for t in ("mkfs.ext4", "mount", "umount") if shutil.which(t) is None]
    return f"missing {', '.join(missing)}" if missing else ""


async def _tool(*argv: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=TOOL_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return 124, f"{argv[0]} did not finish within {TOOL_TIMEOUT_S:g} s"
    return proc.returncode or 0, out.decode(errors="replace")


def tree_mb(path: Path) -> float:
    """What a folder's files occupy on disk (blocks, not lengths), in MiB; 0 when it is missing."""
    total = 0
    if not path.is_dir():
        return 0.0
    for folder, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                continue
    return total / (1 << 20)


class WorkDisk:
    """One container's workdir volume on the host."""

    def __init__(self, name: str):
        self.name = name
        self.image = DISK_ROOT / f"{name}.img"
        self.mount = DISK_ROOT / name
        self.owner_file = DISK_ROOT / f"{name}.owner"

    @classmethod
    async def make(cls, name: str, size_mb: int, *, owner: str) -> WorkDisk:
        """A fresh, mounted, empty ext4 of `size_mb` (sparse: it takes what is written)."""
        disk = cls(name)
        disk.mount.mkdir(mode=0o700, parents=True, exist_ok=True)
        disk.owner_file.write_text(owner)
        with disk.image.open("wb") as f:
            f.truncate(size_mb << 20)
        # No journal (a scratch disk: it is thrown away, never recovered) and no reserved blocks.
        steps = (
            ("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(disk.image)),
            ("mount", "-o", "loop,nodev,nosuid,noatime", str(disk.image), str(disk.mount)),
        )
        for argv in steps:
            code, out = await _tool(*argv)
            if code != 0:
                await disk.remove()
                raise Unavailable(f"the workdir disk of {name} could not be made ({argv[0]}): {out[-300:]}")
        (disk.mount / "lost+found").rmdir()
        return disk

    def used_mb(self) -> float:
        """What the volume holds now (the host's statvfs: no engine call)."""
        try:
            st = os.statvfs(self.mount)
        except OSError:
            return 0.0
        return (st.f_blocks - st.f_bfree) * st.f_frsize / (1 << 20)

    def mounted(self) -> bool:
        return os.path.ismount(self.mount)

    async def fill_from(self, source: Path, *, owner_uid: int) -> None:
        """The image's workdir copied in, owners and modes kept (they are already the container's
        host uids: `source` is the container's own mounted root); where the image has none, the
        empty volume is `owner_uid`'s (the container's root as the host sees it), mode 755."""
        if not await asyncio.to_thread(os.path.isdir, source):
            os.chown(self.mount, owner_uid, owner_uid)
            os.chmod(self.mount, 0o755)
            return
        code, out = await _tool("cp", "-a", "--", f"{source}/.", f"{self.mount}/")
        if code != 0:
            raise Unavailable(f"the workdir did not fit the disk of {self.name}: {out[-300:]}")
        st = os.stat(source)
        os.chown(self.mount, st.st_uid, st.st_gid)
        os.chmod(self.mount, st.st_mode & 0o7777)

    async def remove(self) -> None:
        """Unmount (lazily when something still holds it) and delete; safe to repeat."""
        if self.mounted():
            code, _ = await _tool("umount", str(self.mount))
            if code != 0:
                code, out = await _tool("umount", "-l", str(self.mount))
                if code != 0:
                    log.warning("workdir_disk_umount_failed", disk=self.name, error=out[-300:])
                    return
        await asyncio.to_thread(self._delete)

    def _delete(self) -> None:
        for path in (self.image, self.owner_file):
            path.unlink(missing_ok=True)
        if self.mount.is_dir():
            os.rmdir(self.mount)


async def sweep_disks(owner: str, *, keep: frozenset[str] = frozenset()) -> int:
    """Remove every disk `owner` made but those of the containers named in `keep`; how many."""
    names = await asyncio.to_thread(_owned, owner)
    for name in names:
        if name not in keep:
            await WorkDisk(name).remove()
    return len([n for n in names if n not in keep])


def _owned(owner: str) -> list[str]:
    """Names of the disks whose marker names `owner`."""
    names = []
    for marker in sorted(DISK_ROOT.glob("*.owner")) if DISK_ROOT.is_dir() else []:
        try:
            if marker.read_text() == owner:
                names.append(marker.name.removesuffix(".owner"))
        except OSError:
            continue
    return names
