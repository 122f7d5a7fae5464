"""A sandbox's tmpfs mount never outlives it: not when the task making it is cancelled mid-way (a
stopping runner), and not after `sweep_leftovers` (what `gyre down` runs once the services are
stopped). Needs root and tmpfs mounts, as CI runs."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from gyre.sandbox.adopt import sweep_leftovers
from gyre.sandbox.host import SandboxHost
from gyre.sandbox.limits import SandboxLimits

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent
LIMITS = SandboxLimits(cpu_s=30, memory_mb=256, max_procs=16, file_size_mb=4, disk_mb=8, cpus=0.5)


def mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [line.split()[1] for line in lines if line.split()[1].startswith(f"{root}/")]


def tmpfs_host() -> SandboxHost:
    host = SandboxHost(REPO / ".gyre" / "test-sandboxes" / f"release-{uuid.uuid4().hex[:8]}")
    if not host.isolation.tmpfs_quota:
        host.root.rmdir()
        pytest.skip("needs root and tmpfs mounts (the sandbox's disk quota)")
    return host


async def test_a_sandbox_cancelled_while_it_mounts_leaves_no_mount_and_no_folder() -> None:
    host = tmpfs_host()
    try:
        for i in range(4):
            path = host.root / f"box{i}"
            making = asyncio.create_task(host.create(path.name, LIMITS))
            for _ in range(10_000):  # bounded: until the thread made the folder it mounts on
                if path.exists() or making.done():
                    break
                await asyncio.sleep(0.001)
            making.cancel()
            with pytest.raises(asyncio.CancelledError):
                await making
            assert not path.exists()
            assert mounts_under(host.root) == []
    finally:
        host.sweep()
        host.root.rmdir()


async def test_sweeping_leftovers_unmounts_and_removes_what_a_killed_owner_left() -> None:
    host = tmpfs_host()
    boxes = [await host.create(f"left{i}", LIMITS) for i in range(2)]
    assert len(mounts_under(host.root)) == 2
    assert sweep_leftovers(host.root, uid_base=host.uid_base) == 2
    assert mounts_under(host.root) == []
    assert list(host.root.iterdir()) == []
    assert all(not b.path.exists() for b in boxes)
    assert sweep_leftovers(host.root / "never-made", uid_base=host.uid_base) == 0
    host.root.rmdir()
