"""`LlmCallRecorded` consumer: a fetched batch is applied in one transaction, acked after commit (shell).

The kernel consumer (`gyre.db.inbox`) claims the batch's events in the inbox and hands the fresh
ones to `CallEvents.apply`, in the same transaction. Undecodable or invalid events (bad shape, a
shared count beyond the parent's tokens, a call id of another execution) are dead-lettered with
the reason; the rest are placed and COPYed. A call refused for good is recorded in
`refused_calls` (same transaction), where it counts towards its execution's recorded calls, so
its group trains without it instead of waiting forever. A delta whose parent is not stored yet
(its record is redelivered later, say) waits: it is retried with back-off, and refused and
dead-lettered only after `max_wait_deliver` deliveries. Redelivered events are skipped by the
inbox, re-sent calls by their `call_id`. If the transaction fails, every message of the batch is
retried later. Stored calls can complete a group whose rewards are in (the proxy's count of
calls reached): the same transaction marks it ready.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, after_commit, after_rollback
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.settle import Fate, Outcome
from services.trajectory import repo
from services.trajectory.call_log import CallLog
from services.trajectory.consumer import publish_if_ready
from services.trajectory.messages import record_from_proto
from services.trajectory.records import CallRecord
from services.trajectory.tree import ParentNotStored

log = structlog.get_logger(__name__)
CALLS_CONSUMER = "trajectory-calls"


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


class CallEvents:
    """Stores the proxy's `LlmCallRecorded` events, a whole fetch at a time."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        calls: CallLog,
        poke: Callable[[], None] = lambda: None,
    ) -> None:
        self.sessions = sessions
        self.calls = calls
        self.poke = poke  # wakes the outbox relay after a commit that enqueued GroupReady
        self.new_tokens = 0
        """Unique tokens stored by committed batches (the benchmark reads it)."""

    def inbox(self) -> Inbox:
        return Inbox(
            sessions=self.sessions,
            table=repo.processed_messages,
            batch=self.apply,
            batch_types=(proxy_events.LlmCallRecorded,),
            on_give_up=self.give_up,
        )

    def spec(self, *, retry_base_s: float = 1.0) -> ConsumerSpec:
        return ConsumerSpec(
            durable=CALLS_CONSUMER,
            producer="proxy",
            inbox=self.inbox(),
            batch=64,
            # A delta waits for a parent redelivered within `ack_wait_s` (a crash's unacked
            # batch): retried every 4 s at most, so it lands soon after its parent instead of up
            # to 30 s later (with the 30 s cap, kill -9 runs took 34 s instead of 17 s to recover
            # when a child just missed its parent; one CI run left a call unstored past 120 s).
            # 30 deliveries wait about 2 minutes before the call is refused; the count stays 30
            # because an existing durable consumer keeps the server-side limit it was made with.
            max_wait_deliver=30,
            wait_retry_max_s=4.0,
            # A batch commits in well under a second; a killed service's unacked batch comes
            # back after this, so it bounds the recovery after a crash.
            ack_wait_s=15.0,
            retry_base_s=retry_base_s,
        )

    async def apply(self, session: AsyncSession, events: Sequence[DecodedEvent]) -> dict[str, Outcome]:
        """Place and store the batch's fresh events; the ones refused (invalid) or waiting."""
        refused_now: dict[str, Outcome] = {}
        records: list[CallRecord] = []
        ids: list[str] = []
        for event in events:
            try:
                records.append(record_from_proto(event.payload.call))
                ids.append(event.event_id)
            except InvalidArgument as exc:
                refused_now[event.event_id] = Outcome(Fate.INVALID, str(exc))
        executions = sorted({r.execution_id for r in records})
        after_rollback(session, lambda: self.calls.forget(executions))
        result = await self.calls.ingest(session, records)
        refused = []
        for k, why in result.rejected.items():
            waits = isinstance(why, ParentNotStored)
            refused_now[ids[k]] = Outcome(Fate.WAITING if waits else Fate.INVALID, str(why))
            if not waits:
                refused.append((records[k].call_id, records[k].execution_id, str(why)))
        touched = set(executions) if result.stored else set()
        if await account_refused(session, refused, touched, causation_id=events[0].event_id):
            after_commit(session, self.poke)

        def stored() -> None:
            self.new_tokens += result.new_tokens
            log.info(
                "calls_stored",
                stored=result.stored,
                duplicates=result.duplicates,
                refused=len(refused_now),
                new_tokens=result.new_tokens,
            )

        after_commit(session, stored)
        return refused_now

    async def give_up(self, session: AsyncSession, event: DecodedEvent, reason: str) -> None:
        """A call that waited (or failed) too often is refused, so its group does not wait for it."""
        call = event.payload.call
        if await account_refused(
            session, [(call.call_id, call.execution_id, reason)], set(), causation_id=event.event_id
        ):
            after_commit(session, self.poke)
