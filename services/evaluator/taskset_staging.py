"""Write a task set to a folder all or nothing: a temporary sibling folder renamed into place
(shell: files).

`gyre tasks generate` and `gyre tasks import` both write sets this way, so an interrupted or
failed run leaves nothing behind and `out` is either absent or the whole set.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from gyre.errors import InvalidArgument

MANIFEST = "taskset.json"


def check_destination(out: Path, *, field: str) -> Path:
    """`out` must be new or an empty folder in a writable parent; returns the parent. Problems
    are named by `field` (the option the user typed)."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument(field, f"{out} exists and is not an empty folder; choose a new one")
    parent = out.resolve().parent
    if not parent.is_dir():
        raise InvalidArgument(field, f"the parent folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InvalidArgument(field, f"cannot write in {parent} (permission denied)")
    return parent


def write_staged(out: Path, fill: Callable[[Path], dict[str, object]], *, field: str) -> dict[str, object]:
    """Call `fill(staging)` to write the tasks and return the manifest, write the manifest, then
    rename the staging folder to `out`; returns the manifest."""
    parent = check_destination(out, field=field)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    except OSError as exc:
        raise InvalidArgument(field, f"cannot write in {parent}: {exc.strerror or exc}") from exc
    try:
        manifest = fill(staging)
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        staging.chmod(0o755)
        if out.exists():
            out.rmdir()  # empty (checked above)
        staging.rename(out)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise InvalidArgument(field, f"writing the task set in {parent} failed: {exc}") from exc
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest
