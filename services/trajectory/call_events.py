"""`LlmCallRecorded` consumer: a fetched batch is applied in one transaction, acked after commit (shell).

A batch of up to `batch` messages: undecodable or invalid ones (bad shape, a shared count
beyond the parent's tokens, a call id of another execution) are dead-lettered with the reason;
the rest are claimed in the inbox, placed and COPYed in one transaction, then acked. A call
refused for good is recorded in `refused_calls` (same transaction), where it counts towards its
execution's recorded calls, so its group trains without it instead of waiting forever. A delta
whose parent is not stored yet (its record is redelivered later, say) waits: it is naked and
retried with back-off, and dead-lettered only after `max_wait_deliver` deliveries. Redelivered
events are skipped by the inbox, re-sent calls by their `call_id`. If the transaction fails,
every message of the batch is retried later. Stored calls can complete a group whose rewards
are in (the proxy's count of calls reached): the same transaction marks it ready.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent, UndecodableEvent
from gyre.proxy.v1 import events_pb2 as proxy_events
from services.trajectory import repo
from services.trajectory.call_log import CallLog, IngestResult, raw_connection
from services.trajectory.consumer import publish_if_ready
from services.trajectory.messages import record_from_proto
from services.trajectory.records import CallRecord
from services.trajectory.tree import ParentNotStored

log = structlog.get_logger(__name__)
CALLS_CONSUMER = "trajectory-calls"


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchOutcome:
    result: IngestResult
    invalid: dict[int, str]
    """Index in the batch -> reason, for events refused before or during placement."""
    waiting: dict[int, str]
    """Index in the batch -> why it waits (a delta parent not stored yet)."""
    num_ready_groups: int = 0


async def apply_events(
    sessions: async_sessionmaker[AsyncSession], calls: CallLog, events: Sequence[DecodedEvent]
) -> BatchOutcome:
    """Claim, place and store a batch of decoded `LlmCallRecorded` events in one transaction."""
    invalid: dict[int, str] = {}
    records: list[CallRecord] = []
    positions: list[int] = []
    for i, event in enumerate(events):
        try:
            records.append(record_from_proto(event.payload.call))
            positions.append(i)
        except InvalidArgument as exc:
            invalid[i] = str(exc)
    try:
        async with sessions() as session, session.begin():
            pg = await raw_connection(session)
            ids = [uuid.UUID(events[i].event_id) for i in positions]
            claimed = {
                r["event_id"]
                for r in await pg.fetch(
                    "INSERT INTO trajectory.processed_messages (consumer, event_id) "
                    "SELECT $1, unnest($2::uuid[]) ON CONFLICT DO NOTHING RETURNING event_id",
                    CALLS_CONSUMER,
                    ids,
                )
            }
            skip = frozenset(k for k, event_id in enumerate(ids) if event_id not in claimed)
            result = await calls.ingest(session, records, skip=skip)
            result.duplicates += len(skip)
            if result.rejected:
                # Refused records must not stay claimed, or a corrected resend would be skipped.
                await pg.execute(
                    "DELETE FROM trajectory.processed_messages WHERE consumer = $1 AND event_id = ANY($2)",
                    CALLS_CONSUMER,
                    [ids[k] for k in result.rejected],
                )
            refused = [
                (records[k].call_id, records[k].execution_id, str(exc))
                for k, exc in result.rejected.items()
                if not isinstance(exc, ParentNotStored)
            ]
            touched = {r.execution_id for r in records} if result.stored else set()
            ready = await account_refused(
                session, refused, touched, causation_id=events[positions[0]].event_id
            )
    except BaseException:
        calls.forget([r.execution_id for r in records])
        raise
    waiting: dict[int, str] = {}
    for k, why in result.rejected.items():
        (waiting if isinstance(why, ParentNotStored) else invalid)[positions[k]] = str(why)
    return BatchOutcome(result=result, invalid=invalid, waiting=waiting, num_ready_groups=ready)


async def account_refused(
    session: AsyncSession, refused: list[tuple[str, str, str]], touched: set[str], *, causation_id: str
) -> int:
    """Record calls refused for good, then complete the groups of the executions that stored or
    refused a call (either can be what they waited for); the number of groups made ready."""
    if refused:
        await repo.refuse_calls(session, refused)
    executions = sorted(touched | {e for _, e, _ in refused})
    if not executions:
        return 0
    ready = 0
    for task_id in await repo.waiting_groups_of(session, executions):
        ready += await publish_if_ready(session, task_id, causation_id=causation_id)
    return ready


class CallEvents(Consumer):
    """Durable consumer of the proxy's `LlmCallRecorded`, processing whole fetches at once."""

    def __init__(
        self,
        bus: Bus,
        sessions: async_sessionmaker[AsyncSession],
        calls: CallLog,
        poke: Callable[[], None] = lambda: None,
        *,
        retry_base_s: float = 1.0,
    ) -> None:
        super().__init__(
            bus,
            ConsumerSpec(
                durable=CALLS_CONSUMER,
                producer="proxy",
                handlers={proxy_events.LlmCallRecorded: self._unused},
                batch=64,
                max_wait_deliver=30,
                # A batch commits in well under a second; a killed service's unacked batch comes
                # back after this, so it bounds the recovery after a crash.
                ack_wait_s=15.0,
                retry_base_s=retry_base_s,
            ),
        )
        self.sessions = sessions
        self.calls = calls
        self.poke = poke  # wakes the outbox relay after a commit that enqueued GroupReady

    async def _wait(self, msg: Msg, event: DecodedEvent, reason: str) -> None:
        """Retry a call later: what it depends on may arrive meanwhile."""
        delivered = msg.metadata.num_delivered
        if delivered >= self.spec.max_wait_deliver:
            call = event.payload.call
            async with self.sessions() as session, session.begin():
                refused = [(call.call_id, call.execution_id, f"waited {delivered} deliveries: {reason}")]
                if await account_refused(session, refused, set(), causation_id=event.event_id):
                    self.poke()
            await self._give_up(msg, f"waited {delivered} deliveries: {reason}")
            return
        log.info("call_waits_for_parent", attempt=delivered, reason=reason)
        await msg.nak(delay=self.spec.retry_delay_s(delivered))

    async def _unused(self, event: DecodedEvent) -> None:  # the batch path replaces it
        raise NotImplementedError

    async def run(self, stop: asyncio.Event) -> None:
        sub = await self._subscribe()
        log.info("consumer_started", consumer=self.spec.durable, producer=self.spec.producer)
        while not stop.is_set():
            try:
                msgs = await sub.fetch(self.spec.batch, timeout=self.spec.fetch_timeout_s)
            except (TimeoutError, NatsTimeoutError):
                continue
            await self.handle_batch(msgs)
        await sub.unsubscribe()

    async def handle_batch(self, msgs: Sequence[Msg]) -> None:
        decoded: list[tuple[Msg, DecodedEvent]] = []
        for msg in msgs:
            try:
                event = await self._decode(msg)
            except UndecodableEvent as exc:
                await self._give_up(msg, f"undecodable: {exc}")
                continue
            if event is None:
                await msg.ack()
                continue
            decoded.append((msg, event))
        if not decoded:
            return
        try:
            outcome = await apply_events(self.sessions, self.calls, [e for _, e in decoded])
        except Exception as exc:  # rolled back: retry the batch with back-off, dead-letter at the limit
            for msg, _ in decoded:
                delivered = msg.metadata.num_delivered
                if delivered >= self.spec.max_deliver:
                    await self._give_up(msg, f"batch failed {delivered} times: {type(exc).__name__}: {exc}")
                else:
                    await msg.nak(delay=self.spec.retry_delay_s(delivered))
            log.warning("call_batch_failed", error=repr(exc), size=len(decoded))
            return
        if outcome.num_ready_groups:
            self.poke()
        for i, (msg, event) in enumerate(decoded):
            if i in outcome.invalid:
                await self._give_up(msg, f"invalid event: {outcome.invalid[i]}")
            elif i in outcome.waiting:
                await self._wait(msg, event, outcome.waiting[i])
            else:
                await msg.ack()
                self.processed += 1
        log.info(
            "calls_stored",
            stored=outcome.result.stored,
            duplicates=outcome.result.duplicates,
            refused=len(outcome.invalid),
            new_tokens=outcome.result.new_tokens,
        )
