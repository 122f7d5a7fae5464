"""Write finished calls' records to the outbox in order, batched (shell).

Records are queued synchronously when a call finishes, before the harness gets its last byte,
so a call's record is always queued before any call whose prompt contains its output: the
delta's parent reaches the outbox (and JetStream) first. `record` returns a future that is true
once the record is committed: the HTTP layer holds the final chunk until then, so an answered
call is never lost to a proxy crash. The same transaction counts the call for its execution
(`proxy.recorded_calls`, what RevokeExecutionToken answers) and keeps its answer by call key
(`proxy.call_answers`), so a harness retrying it is answered from there. Answers delivered
whole are marked so (`mark_delivered`) in a later transaction, best effort. While Postgres is away a batch is
retried for `give_up_after_s`; past that it and everything queued behind it are lost (their
futures false, their harnesses answered an error), since later records may name them as delta
parents.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.events import new_event
from gyre.proxy.v1 import events_pb2, proxy_pb2
from gyre.tracing import current_carrier
from services.proxy import repo
from services.proxy.render import ReusableOutput

log = structlog.get_logger(__name__)
PRODUCER = "proxy"
Answer = tuple[str, dict[str, Any]]
"""(call key, answer) of a call, kept for its harness's retry (`call_keys`)."""
Item = tuple[proxy_pb2.CallRecord, ReusableOutput | None, dict[str, str], asyncio.Future[bool], Answer | None]
"""A call's record, its reusable output, its trace context (the batch is written by another
task, outside the call's trace), the future that says it is committed and its answer."""


class Recorder:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        *,
        batch: int = 256,
        linger_s: float = 0.0,
        give_up_after_s: float = 60.0,
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.batch = batch
        self.linger_s = linger_s
        self.give_up_after_s = give_up_after_s
        self.on_lost: Callable[[Sequence[proxy_pb2.CallRecord]], None] = lambda calls: None
        self._queue: asyncio.Queue[Item] = asyncio.Queue()
        self._delivered: list[tuple[str, str]] = []

    def record(
        self, call: proxy_pb2.CallRecord, output: ReusableOutput | None = None, answer: Answer | None = None
    ) -> asyncio.Future[bool]:
        """Queue a call's record (and the reusable form of its output, and its answer by call key);
        the future says it is durable."""
        durable: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((call, output, current_carrier(), durable, answer))
        return durable

    def mark_delivered(self, execution_id: str, call_key: str) -> None:
        self._delivered.append((execution_id, call_key))

    async def _flush_delivered(self) -> None:
        pairs, self._delivered = self._delivered, []
        try:
            async with self.sessions() as session, session.begin():
                await repo.mark_delivered(session, pairs)
        except Exception as exc:  # best effort: an unmarked answer only serves one more retry
            log.warning("delivered_marks_lost", error=repr(exc), num_calls=len(pairs))

    async def run(self, stop: asyncio.Event) -> None:
        while not (stop.is_set() and self._queue.empty()):
            if self._delivered:
                await self._flush_delivered()
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except TimeoutError:
                continue
            # Harnesses wait for their record's commit, so no lingering by default: records that
            # finish while a batch commits form the next batch (group commit).
            if self.linger_s and not stop.is_set():
                await asyncio.sleep(self.linger_s)
            calls = [first]
            while not self._queue.empty() and len(calls) < self.batch:
                calls.append(self._queue.get_nowait())
            await self._write(calls)
        if self._delivered:
            await self._flush_delivered()

    async def _write(self, items: list[Item]) -> None:
        calls = [item[0] for item in items]
        outputs = [(item[0].execution_id, item[1]) for item in items if item[1] is not None]
        answers = [(item[0].execution_id, *item[4]) for item in items if item[4] is not None]
        counts = Counter(call.execution_id for call in calls)
        events = []
        for call, _, trace_context, *_ in items:
            event = new_event(
                events_pb2.LlmCallRecorded(call=call),
                producer=PRODUCER,
                correlation_id=call.execution_id,
                causation_id=call.call_id,
            )
            event.trace_context.update(trace_context)
            events.append(event)
        deadline = time.monotonic() + self.give_up_after_s
        for attempt in range(10_000):  # bounded by the deadline below
            try:
                async with self.sessions() as session, session.begin():
                    await enqueue(session, repo.outbox, *events)
                    await repo.save_outputs(session, outputs)
                    await repo.count_calls(session, counts)
                    await repo.save_answers(session, answers)
                break
            except Exception as exc:  # Postgres away: keep the records, retry with backoff
                log.warning("record_write_failed", error=repr(exc), attempt=attempt)
                if time.monotonic() > deadline:
                    self._lose(items)
                    return
                await asyncio.sleep(min(0.1 * 2**attempt, 2.0))
        for item in items:
            if not item[3].done():
                item[3].set_result(True)
        self.relay.poke()

    def _lose(self, items: list[Item]) -> None:
        """Give up on a batch and on everything queued behind it (they may be its delta children)."""
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        log.error("records_lost", num_calls=len(items), call_ids=[item[0].call_id for item in items][:20])
        for item in items:
            if not item[3].done():
                item[3].set_result(False)
        self.on_lost([item[0] for item in items])
