"""Where the proxy's CPU work on harness input runs: per-execution slots and low-priority
worker threads (shell).

Reading, parsing, rendering and tokenising a request can take seconds of CPU for a large one.
Done on the event loop, it would stall every other execution's stream meanwhile; done without a
bound, one execution's many connections could take every worker. So each execution holds at most
`per_execution` slots at a time, and the work itself runs in threads whose CPU priority is lower
than the event loop's.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import structlog

log = structlog.get_logger(__name__)
T = TypeVar("T")

NICE_STEP = 10
"""How much less CPU priority render workers have than the event loop's thread: when both want a
core, the streams of every execution go first and a flood of heavy requests waits."""


def _yield_cpu() -> None:
    """Run in each render worker as it starts: lower this thread's priority (Linux sets nice per
    thread; a process may always lower its own)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + NICE_STEP))
    except OSError:  # not permitted here (a sandbox without setpriority): keep the priority
        log.info("render_priority_unchanged")


class RenderWorkers:
    """Per-execution slots over one pool of low-priority threads."""

    def __init__(self, *, per_execution: int = 1) -> None:
        self.per_execution = per_execution
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._pool = ThreadPoolExecutor(
            max_workers=os.cpu_count() or 2, thread_name_prefix="proxy-render", initializer=_yield_cpu
        )

    def slot(self, execution_id: str) -> asyncio.Semaphore:
        """Held while a request of the execution is read, parsed or rendered: at most
        `per_execution` of one execution at a time, so its many connections cannot take every
        worker, core or turn of the event loop; the others wait unread, costing nothing."""
        slot = self._slots.get(execution_id)
        if slot is None:
            slot = self._slots[execution_id] = asyncio.Semaphore(self.per_execution)
        return slot

    def forget(self, execution_id: str) -> None:
        self._slots.pop(execution_id, None)

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a render worker (lower CPU priority than the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
