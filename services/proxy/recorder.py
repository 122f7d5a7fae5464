"""Write finished calls' records to the outbox in order, batched (shell).

Records are queued synchronously when a call finishes, before the harness gets its last byte,
so a call's record is always queued before any call whose prompt contains its output: the
delta's parent reaches the outbox (and JetStream) first.
"""

from __future__ import annotations

import asyncio

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
Queued = tuple[proxy_pb2.CallRecord, ReusableOutput | None, dict[str, str]]


class Recorder:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        *,
        batch: int = 256,
        linger_s: float = 0.05,
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.batch = batch
        self.linger_s = linger_s
        self._queue: asyncio.Queue[Queued] = asyncio.Queue()

    def record(self, call: proxy_pb2.CallRecord, output: ReusableOutput | None = None) -> None:
        """Queue a call's record, and the reusable form of its output when there is one, with the
        call's trace context (the batch is written by another task, outside the call's trace)."""
        self._queue.put_nowait((call, output, current_carrier()))

    async def run(self, stop: asyncio.Event) -> None:
        while not (stop.is_set() and self._queue.empty()):
            try:
                first = await asyncio.wait_for(self._queue.get(), timeout=0.5)
            except TimeoutError:
                continue
            # Linger briefly so a busy proxy writes one transaction per batch, not per call.
            if self.linger_s and not stop.is_set():
                await asyncio.sleep(self.linger_s)
            calls = [first]
            while not self._queue.empty() and len(calls) < self.batch:
                calls.append(self._queue.get_nowait())
            await self._write(calls)

    async def _write(self, items: list[Queued]) -> None:
        calls = [call for call, _, _ in items]
        outputs = [(call.execution_id, output) for call, output, _ in items if output is not None]
        events = []
        for call, _, trace_context in items:
            event = new_event(
                events_pb2.LlmCallRecorded(call=call),
                producer=PRODUCER,
                correlation_id=call.execution_id,
                causation_id=call.call_id,
            )
            event.trace_context.update(trace_context)
            events.append(event)
        for attempt in range(10):
            try:
                async with self.sessions() as session, session.begin():
                    await enqueue(session, repo.outbox, *events)
                    await repo.save_outputs(session, outputs)
                break
            except Exception as exc:  # Postgres away: keep the records, retry with backoff
                log.warning("record_write_failed", error=repr(exc), attempt=attempt)
                await asyncio.sleep(min(0.1 * 2**attempt, 5))
        else:
            log.error("records_lost", num_calls=len(calls))
            return
        self.relay.poke()
