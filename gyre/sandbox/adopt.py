"""Take over a sandbox another (crashed) process of this host started (shell: files, users).

A runner killed with -9 leaves its sandboxes running under their keepers (`gyre.sandbox.keeper`).
The restarted runner knows which executions it was running from its own tables; `adopt` rebuilds
the `Sandbox` of one from what is on disk: its folder, its user (the owner of `work/`), its
cgroups, its mount and the keeper's pid. The adopted sandbox is waited for, killed and released
exactly like one this process launched. `sweep_leftovers` releases what a stopped stack left.
"""

from __future__ import annotations

import pwd
from pathlib import Path

from gyre.sandbox.host import Sandbox, SandboxHost
from gyre.sandbox.keeper import KEEPER_FILE, ForwardStats, read_keeper
from gyre.sandbox.limits import SandboxLimits


def adopt(host: SandboxHost, name: str, limits: SandboxLimits) -> Sandbox | None:
    """The sandbox called `name` under the host's root, or None when there is none.

    Its keeper may have ended meanwhile: `Sandbox.wait` then returns at once with the outcome the
    keeper wrote (or `keeper_lost` when it left none).
    """
    path = host.root / name
    if not (path / "work").is_dir():
        return None
    uid: int | None = None
    gid: int | None = None
    user = ""
    owner = (path / "work").stat().st_uid
    if host.isolation.own_user and host.uid_base <= owner < host.uid_base + host.uid_count:
        uid = owner
        try:
            entry = pwd.getpwuid(owner)
            user, gid = entry.pw_name, entry.pw_gid
        except KeyError:
            gid = owner  # a bare uid (no useradd on this host)
        host._uids_in_use.add(owner)
    box = Sandbox(host=host, name=name, path=path, limits=limits, uid=uid, gid=gid, user=user)
    box.mounted = _is_mount(path)
    caps = host.caps
    for base in (caps.cgroup_memory, caps.cgroup_pids, caps.cgroup_cpu):
        if base and (Path(base) / f"gyre-{name}").is_dir():
            box.cgroups.append(Path(base) / f"gyre-{name}")
    box.keeper = read_keeper(path / "log" / KEEPER_FILE) or (0, None)
    if (path / "forward").is_dir():
        box.forwarder = ForwardStats(folder=path / "forward")
    return box


def _is_mount(path: Path) -> bool:
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[1] == str(path) for line in mounts if len(line.split()) > 1)


def sweep_leftovers(root: Path, *, uid_base: int) -> int:
    """Release every sandbox under `root` (keeper killed, unmounted, users, cgroups and folders
    removed) once its owner is stopped: a runner killed past its grace leaves them running and
    mounted. A missing root has none. Returns how many."""
    if not root.is_dir():
        return 0
    return SandboxHost(root, uid_base=uid_base).sweep()
