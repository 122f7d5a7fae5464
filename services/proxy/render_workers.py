"""Where the proxy's CPU work on harness input runs: per-execution slots, a fair queue over
low-priority worker threads, and the wait a refused execution serves (shell).

Reading, parsing, rendering and tokenising a request can take seconds of CPU for a large one.
Done on the event loop, it would stall every other execution's stream meanwhile; done without a
bound, one execution's many connections could take every worker. So each execution holds at most
`per_execution` slots at a time (its other requests wait unread, costing nothing), the jobs go to
the workers through a fair queue (`fair_queue.FairQueue`: when workers are short, the execution
that has used the least worker CPU goes first), the threads' CPU priority is lower than the
event loop's, and an execution whose request was refused waits before its next is read, in
proportion to what the refused one cost (`fair_queue.refusal_wait_s`).
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from gyre.errors import GyreError, Unavailable
from services.proxy.fair_queue import FairQueue, refusal_wait_s

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


@dataclass(slots=True)
class _Standing:
    """One execution's account: worker CPU since its last accepted request, refusals in a row,
    and until when (monotonic) its next request waits."""

    cpu_s: float = 0.0
    refusals: int = 0
    wait_until: float = 0.0


class RenderWorkers:
    """Per-execution slots over one fairly shared pool of low-priority threads."""

    def __init__(self, *, per_execution: int = 1, refusal_wait_max_s: float = 1.0) -> None:
        self.per_execution = per_execution
        self.refusal_wait_max_s = refusal_wait_max_s
        workers = os.cpu_count() or 2
        self._slots: dict[str, asyncio.Semaphore] = {}
        self._standing: dict[str, _Standing] = {}
        self._queue: FairQueue[asyncio.Future[None]] = FairQueue(workers=workers)
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="proxy-render", initializer=_yield_cpu
        )

    @asynccontextmanager
    async def slot(self, execution_id: str, *, accepts: bool = False) -> AsyncIterator[None]:
        """Held while a request of the execution is read, parsed or rendered: at most
        `per_execution` of one execution at a time, so its many connections cannot take every
        worker, core or turn of the event loop; the others wait unread, costing nothing. A refusal
        raised inside (a GyreError other than the proxy's own Unavailable) makes its next request
        wait; `accepts`: leaving without one means the request was accepted, which clears that."""
        semaphore = self._slots.get(execution_id)
        if semaphore is None:
            semaphore = self._slots[execution_id] = asyncio.Semaphore(self.per_execution)
        async with semaphore:
            standing = self._standing.setdefault(execution_id, _Standing())
            wait = standing.wait_until - time.monotonic()
            if wait > 0:  # its last request was refused: it repays that one's cost first
                await asyncio.sleep(wait)
            try:
                yield
            except GyreError as exc:
                if not isinstance(exc, Unavailable):
                    standing.refusals += 1
                    standing.wait_until = time.monotonic() + refusal_wait_s(
                        standing.refusals, standing.cpu_s, max_s=self.refusal_wait_max_s
                    )
                    standing.cpu_s = 0.0
                raise
            if accepts:
                standing.refusals, standing.cpu_s, standing.wait_until = 0, 0.0, 0.0

    def forget(self, execution_id: str) -> None:
        self._slots.pop(execution_id, None)
        self._standing.pop(execution_id, None)
        self._queue.forget(execution_id)

    async def run(self, execution_id: str, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a render worker (lower CPU priority than the event loop), once the fair
        queue gives the execution one."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.submit(execution_id, turn)
        self._dispatch()
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # given a worker just as it was cancelled
                self._queue.done(execution_id, 0.0)
                self._dispatch()
            raise
        cpu = [0.0]

        def timed() -> T:
            started = time.thread_time()
            try:
                return fn(*args)
            finally:
                cpu[0] = time.thread_time() - started

        def finished(_: object) -> None:  # when the thread is done, even if its caller is gone
            self._queue.done(execution_id, cpu[0])
            standing = self._standing.get(execution_id)
            if standing is not None:
                standing.cpu_s += cpu[0]
            self._dispatch()

        job = asyncio.get_running_loop().run_in_executor(self._pool, timed)
        job.add_done_callback(finished)  # before the caller's wake-up: charged before it resumes
        return await asyncio.shield(job)

    def _dispatch(self) -> None:
        """Hand free workers to the waiting jobs the fair queue picks (cancelled ones pass theirs on)."""
        while (picked := self._queue.start_next()) is not None:
            execution_id, turn = picked
            if turn.done():  # its request went away while it waited
                self._queue.done(execution_id, 0.0)
                continue
            turn.set_result(None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
