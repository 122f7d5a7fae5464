"""Where a host keeps its sandboxes: a root that stays visible from inside them (shell: paths)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import structlog

from gyre.errors import InvalidArgument

log = structlog.get_logger(__name__)
SHARED_TEMP = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
RELOCATED_ROOTS = Path("/var/lib/gyre/sandboxes")
HIDDEN = ("/root", "/home")
"""Absent inside; a sandbox root under them moves (see `usable_root`)."""


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
