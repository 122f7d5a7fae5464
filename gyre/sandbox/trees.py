"""Folder trees someone else controls: copy, remove, chown and measure them safely (shell: files).

`bounded_copy` is used where a host process (root) copies a tree the sandbox user could have
shaped: a workspace into a grading sandbox, a template into a workspace. It walks with
descriptors (`openat` with O_NOFOLLOW relative to the folder already opened), so swapping a
folder for a symlink mid-copy cannot redirect a read or a write outside the two trees; it copies
folders, regular files and symlinks (as links, never followed) and skips everything else (fifos,
sockets, devices); it is iterative (no recursion limit) and stops with `CopyRefused` at the
first bound passed: files, depth, bytes or the deadline. Everything it creates is owned by the
caller; `dest` must be an existing empty folder.
"""

from __future__ import annotations

import os
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

CHUNK = 1 << 20
RM_TIMEOUT_S = 600.0
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True, kw_only=True)
class CopyBounds:
    max_files: int = 100_000
    """Entries of any kind (folders, files, links)."""
    max_depth: int = 64
    max_bytes: int = 512 * 1024 * 1024
    deadline: float = float("inf")
    """time.monotonic() value after which the copy stops."""


class CopyRefused(Exception):
    """The tree passed a bound; the message says which (a property of the tree, not a crash)."""


@dataclass(slots=True)
class _Count:
    files: int = 0
    bytes: int = 0


def bounded_copy(src: Path, dest: Path, bounds: CopyBounds) -> int:
    """Copy the tree under `src` into `dest`; returns the bytes copied.

    Example: a workspace holding `a.py` and `pkg/b.py` -> the same two files under dest; a
    folder chain 1,100 deep with max_depth 64 -> CopyRefused("... deeper than 64 folders").
    """
    count = _Count()
    roots = (os.open(src, DIR_FLAGS), os.open(dest, DIR_FLAGS))
    # Folders still to walk, as name paths from the roots: each is reopened one component at a
    # time with O_NOFOLLOW, so only a handful of descriptors are open however wide the tree is.
    stack: list[tuple[str, ...]] = [()]
    try:
        while stack:
            parts = stack.pop()
            s_fd, d_fd = (_open_below(root, parts) for root in roots)
            try:
                for entry in _entries(s_fd):
                    _check(count, bounds)
                    count.files += 1
                    if _copy_entry(entry, s_fd, d_fd, count, bounds):
                        if len(parts) + 1 > bounds.max_depth:
                            raise CopyRefused(f"the tree is deeper than {bounds.max_depth} folders")
                        stack.append((*parts, entry.name))
            finally:
                os.close(s_fd)
                os.close(d_fd)
    finally:
        for fd in roots:
            os.close(fd)
    return count.bytes


def _open_below(root_fd: int, parts: tuple[str, ...]) -> int:
    fd = os.open(".", DIR_FLAGS, dir_fd=root_fd)
    for name in parts:
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


def _entries(dir_fd: int) -> list[os.DirEntry[str]]:
    with os.scandir(dir_fd) as it:
        return list(it)


def _check(count: _Count, bounds: CopyBounds) -> None:
    if count.files >= bounds.max_files:
        raise CopyRefused(f"the tree holds more than {bounds.max_files} files and folders")
    if time.monotonic() > bounds.deadline:
        raise CopyRefused("copying the tree took past the deadline")


def _copy_entry(entry: os.DirEntry[str], s_fd: int, d_fd: int, count: _Count, bounds: CopyBounds) -> bool:
    """Copy one entry; True for a folder (created empty, to be walked)."""
    name = entry.name
    st = os.stat(name, dir_fd=s_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=s_fd), name, dir_fd=d_fd)
        return False
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(name, 0o700, dir_fd=d_fd)
        os.chmod(name, (st.st_mode & 0o777) | 0o700, dir_fd=d_fd)  # just made: a folder of ours
        return True
    if not stat.S_ISREG(st.st_mode):
        return False  # fifo, socket, device: nothing a grader or a harness needs
    count.bytes += st.st_size
    if count.bytes > bounds.max_bytes:
        raise CopyRefused(f"the tree holds more than {bounds.max_bytes // (1024 * 1024)} MiB")
    fin = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=s_fd)
    try:
        if not stat.S_ISREG(os.fstat(fin).st_mode):  # swapped between the stat and the open
            return False
        fout = os.open(
            name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=d_fd
        )
        try:
            _copy_bytes(fin, fout, limit=st.st_size, bounds=bounds)
            os.fchmod(fout, st.st_mode & 0o777)
        finally:
            os.close(fout)
    finally:
        os.close(fin)
    return False


def _copy_bytes(fin: int, fout: int, *, limit: int, bounds: CopyBounds) -> None:
    """Copy at most `limit` bytes (the size seen at stat: a file growing meanwhile is cut there)."""
    left = limit
    while left > 0:
        data = os.read(fin, min(CHUNK, left))
        if not data:
            return
        os.write(fout, data)
        left -= len(data)
        if time.monotonic() > bounds.deadline:
            raise CopyRefused("copying the tree took past the deadline")


def remove_tree(path: Path) -> None:
    """Delete the tree under `path` and `path` itself; missing is fine.

    GNU `rm -rf` walks with descriptors and without recursion (a chain of 1,100 folders is fine,
    where shutil.rmtree recurses past Python's limit) and never follows a link.
    """
    if not os.path.lexists(path):
        return
    done = subprocess.run(
        ["rm", "-rf", "--one-file-system", "--", str(path)],
        capture_output=True,
        timeout=RM_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0 and os.path.lexists(path):
        raise OSError(f"could not remove {path}: {done.stderr.decode(errors='replace').strip()[:300]}")


def chown_tree(top: Path, uid: int, gid: int) -> None:
    """lchown everything under `top` (iterative: no recursion limit; links are not followed)."""
    stack = [str(top)]
    os.lchown(top, uid, gid)
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                os.lchown(entry.path, uid, gid)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


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
