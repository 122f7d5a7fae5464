"""A container's hard disk limit: a read-only root, the workdir on its own loop-mounted ext4 and
tmpfs elsewhere, so a write past the quota gets ENOSPC and the host's disk holds at most the
quota (live: Podman as root; `gyre.sandbox.oci_disk`)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from bench.dataset_fixtures import FIXTURES, build_image, image_tag
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.sandbox.oci_disk import SLACK_MB, WorkDisk, disk_unsupported
from gyre_app.images import DEFAULT_BASE, build_base

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_engine() is None, reason="no container engine (.ci/run installs podman and runc)"
    ),
    pytest.mark.skipif(bool(disk_unsupported()), reason=f"no hard disk limit here: {disk_unsupported()}"),
]
CALC = next(f for f in FIXTURES if f.name == "mini-calc-1")
QUOTA_MB = 16
FILL = (
    "import os\ntotal = 0\ntry:\n    with open({path!r}, 'wb') as f:\n        for _ in range(64):\n"
    "            f.write(b'x' * (1 << 20)); f.flush(); os.fsync(f.fileno()); total += 1\n"
    "except OSError as e:\n    print('ERR', e.errno, total)\nelse:\n    print('WROTE', total)\n"
)


@pytest.fixture(scope="module")
def image() -> str:
    build_base(DEFAULT_BASE)
    build_image(CALC)
    return image_tag(CALC)


def test_writes_past_the_quota_get_enospc_and_the_host_holds_at_most_the_quota(image: str) -> None:
    async def probe() -> dict[str, object]:
        backend = OciBackend()
        limits = ContainerLimits(memory_mb=512, storage_mb=QUOTA_MB)
        box = await backend.create(
            name=f"gyre-test-disk-{uuid.uuid4().hex[:8]}",
            image=image,
            limits=limits,
            workdir=CALC.workdir,
            hidden=("/root/r2e_tests",),
        )
        disk = box.disk
        assert disk is not None
        try:
            head = await box.exec(["git", "rev-parse", "HEAD"], timeout_s=30, workdir=CALC.workdir)
            work = await box.exec(
                ["python3", "-c", FILL.format(path="fill.bin")], timeout_s=60, workdir=CALC.workdir
            )
            blocks = disk.image.stat().st_blocks * 512 >> 20
            used = disk.used_mb() - box.storage_base_mb
            tmp = await box.exec(["python3", "-c", FILL.format(path="/tmp/fill.bin")], timeout_s=60)
            root = await box.exec(["sh", "-c", "echo x > /usr/x; echo x > /root/x"], timeout_s=30)
            hidden = await box.exec(["ls", "-A", "/root/r2e_tests"], timeout_s=30)
            return {
                "head": head,
                "work": work,
                "used": used,
                "blocks": blocks,
                "tmp": tmp,
                "root": root,
                "hidden": hidden,
                "over": work.storage_exceeded,
            }
        finally:
            await box.close()
            gone = not disk.image.exists() and not disk.mount.exists()
            assert gone, "the disk outlived its container"

    seen = asyncio.run(probe())
    assert seen["head"].exit_code == 0  # type: ignore[attr-defined]  # the image's repository is there
    assert seen["work"].output.startswith(b"ERR 28 ")  # type: ignore[attr-defined]  # ENOSPC
    assert seen["used"] <= QUOTA_MB + SLACK_MB  # type: ignore[operator]
    assert seen["tmp"].output.startswith(b"ERR 28 ")  # type: ignore[attr-defined]
    assert seen["root"].output.count(b"Read-only file system") == 2  # type: ignore[attr-defined]
    assert seen["hidden"].output == b""  # type: ignore[attr-defined]


def test_a_sweep_removes_the_disks_a_killed_owner_left(image: str) -> None:
    async def leave_and_sweep() -> tuple[bool, bool, bool, int]:
        backend = OciBackend()
        owner = f"test:{uuid.uuid4().hex[:8]}"
        names = [f"gyre-test-disk-{uuid.uuid4().hex[:8]}" for _ in range(2)]
        for name in names:  # as a killed owner leaves them: never closed
            await backend.create(
                name=name,
                image=image,
                limits=ContainerLimits(storage_mb=8),
                workdir=CALC.workdir,
                owner=owner,
            )
        removed = await backend.sweep(owner, keep=frozenset(names[1:]))
        first, second = WorkDisk(names[0]), WorkDisk(names[1])
        left = first.image.exists() or first.mount.exists()
        kept = second.mounted()
        await backend.sweep(owner)
        return left, kept, second.image.exists() or second.mount.exists(), removed

    left, kept, left_after, removed = asyncio.run(leave_and_sweep())
    assert removed == 1 and not left and kept and not left_after
