"""A sandbox's cgroups (v1 hierarchies): make them with its limits, list and kill what is in
them, remove them (shell: files under /sys/fs/cgroup)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import structlog

from gyre.sandbox.limits import MIB, Capabilities, SandboxLimits

log = structlog.get_logger(__name__)


def make_cgroups(caps: Capabilities, name: str, limits: SandboxLimits, *, made: list[Path]) -> None:
    """Memory, pids and (where there is one) cpu cgroups named `name`, limits written; each is
    added to `made` as soon as it exists, so a failure half-way leaves nothing unreleased."""
    mem, pids = (Path(base) / name for base in (caps.cgroup_memory, caps.cgroup_pids))
    cpu = Path(caps.cgroup_cpu) / name if caps.cgroup_cpu else None
    for d in (mem, pids, cpu):
        if d is not None:
            d.mkdir(exist_ok=True)
            made.append(d)
    (mem / "memory.limit_in_bytes").write_text(str(limits.memory_mb * MIB))
    with contextlib.suppress(OSError):  # without swap accounting the file is missing
        (mem / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_mb * MIB))
    (pids / "pids.max").write_text(str(limits.max_procs + 8))  # +8: set-up and its helpers
    if cpu is not None:
        period_us, quota_us = limits.cfs_quota()
        (cpu / "cpu.cfs_period_us").write_text(str(period_us))
        (cpu / "cpu.cfs_quota_us").write_text(str(quota_us))


def cgroup_pids(cgroup: Path) -> list[int]:
    try:
        return [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def remove_cgroup(cgroup: Path) -> None:
    """rmdir a sandbox's cgroup. Its last processes may still be exiting (the namespace's pid 1
    takes the rest down as it goes), and rmdir fails while any is in it: kill and retry, bounded."""
    for _ in range(100):
        pids = cgroup_pids(cgroup)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)
    log.warning("sandbox_cgroup_left", cgroup=str(cgroup))
