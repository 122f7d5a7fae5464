"""Exactly-once consumption: each event is recorded in the handler's own transaction (shell).

`apply_batch` is the one path every database-backed consumer takes (`gyre.consume` calls it
when a `ConsumerSpec` has an `Inbox`): a fetched batch is applied in ONE transaction; every
event is first claimed in the service's `processed_messages` table (`(consumer, event_id)`),
then its handler runs under a savepoint. An event already claimed is a duplicate and is not
applied again. A handler that fails rolls back its savepoint: its effects and its claim go
together, and the event is retried (or dead-lettered if it is invalid). Nothing is acked
before the commit; if the commit fails, every event of the batch is retried. A failure that
reads as a lost connection is `Fate.UNAVAILABLE`, which the consumer waits out uncounted.

Work that must follow the commit (waking a relay, starting a process) is registered with
`after_commit`; cache entries filled during the transaction are dropped with `after_rollback`.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
import structlog
from google.protobuf import message
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent, UndecodableEvent
from gyre.logs import bind_ids
from gyre.outages import failure_fate
from gyre.settle import APPLIED, DUPLICATE, Fate, Outcome
from gyre.tracing import continued_from

log = structlog.get_logger(__name__)

TxHandler = Callable[[AsyncSession, DecodedEvent], Awaitable[None]]
"""Applies one event with `session` (inside the batch's transaction; never commits itself)."""
BatchHandler = Callable[[AsyncSession, Sequence[DecodedEvent]], Awaitable[Mapping[str, Outcome]]]
"""Applies the fresh events of a batch at once; returns the events it refused (event_id -> outcome,
INVALID or WAITING), whose claims are released in the same transaction."""
GiveUp = Callable[[AsyncSession, DecodedEvent, str], Awaitable[None]]

_COMMIT_HOOKS = "gyre_after_commit"
_ROLLBACK_HOOKS = "gyre_after_rollback"


class NotYet(Exception):
    """Raised by a handler whose event depends on one not applied yet: retried later, not failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Inbox:
    """Where and how a consumer applies its events exactly once."""

    sessions: async_sessionmaker[AsyncSession]
    table: sa.Table
    """The service's `processed_messages` (`gyre.db.tables.processed_messages_table`)."""
    handlers: Mapping[type[message.Message], TxHandler] = field(default_factory=dict)
    batch: BatchHandler | None = None
    """Instead of `handlers`: one call for all fresh events of the batch (`batch_types` says which)."""
    batch_types: tuple[type[message.Message], ...] = ()
    on_give_up: GiveUp | None = None
    """Runs in its own transaction before an event that waited or failed too often is dead-lettered."""

    @property
    def types(self) -> tuple[type[message.Message], ...]:
        return self.batch_types if self.batch is not None else tuple(self.handlers)


def after_commit(session: AsyncSession, fn: Callable[[], Any]) -> None:
    """Run `fn()` (sync or async) once the consuming transaction has committed."""
    session.info.setdefault(_COMMIT_HOOKS, []).append(fn)


def after_rollback(session: AsyncSession, fn: Callable[[], Any]) -> None:
    """Run `fn()` if the transaction (or the handler's savepoint) is rolled back."""
    session.info.setdefault(_ROLLBACK_HOOKS, []).append(fn)


async def claim_events(
    session: AsyncSession, table: sa.Table, *, consumer: str, event_ids: Sequence[str]
) -> set[str]:
    """Record (consumer, event_id) for each id; returns the ids not recorded before."""
    if not event_ids:
        return set()
    stmt = (
        insert(table)
        .values([{"consumer": consumer, "event_id": uuid.UUID(e)} for e in event_ids])
        .on_conflict_do_nothing()
        .returning(table.c.event_id)
    )
    return {str(row.event_id) for row in await session.execute(stmt)}


async def release_events(
    session: AsyncSession, table: sa.Table, *, consumer: str, event_ids: Sequence[str]
) -> None:
    """Forget claims of events refused in this transaction, so a later delivery is applied."""
    if event_ids:
        ids = [uuid.UUID(e) for e in event_ids]
        await session.execute(sa.delete(table).where(table.c.consumer == consumer, table.c.event_id.in_(ids)))


async def apply_batch(inbox: Inbox, consumer: str, events: Sequence[DecodedEvent]) -> list[Outcome]:
    """Apply `events` in one transaction, each claimed in the inbox; one outcome per event."""
    outcomes: list[Outcome] = [DUPLICATE] * len(events)
    async with inbox.sessions() as session:
        try:
            async with session.begin():
                fresh = await claim_events(
                    session, inbox.table, consumer=consumer, event_ids=[e.event_id for e in events]
                )
                todo = []
                for i, e in enumerate(events):  # the same event twice in one batch: applied once
                    if e.event_id in fresh:
                        fresh.discard(e.event_id)
                        todo.append(i)
                if inbox.batch is not None:
                    await _apply_together(session, inbox, consumer, events, todo, outcomes)
                else:
                    for i in todo:
                        outcomes[i] = await _apply_one(session, inbox, consumer, events[i])
        except BaseException as exc:  # the commit (or the batch handler) failed: all is rolled back
            await _run(session.info.pop(_ROLLBACK_HOOKS, []))
            session.info.pop(_COMMIT_HOOKS, None)
            if not isinstance(exc, Exception):  # cancelled: the consumer is stopping
                raise
            log.warning("batch_failed", consumer=consumer, size=len(events), error=repr(exc))
            failed = Outcome(failure_fate(exc), f"{type(exc).__name__}: {exc}")
            return [failed] * len(events)  # the claims rolled back too: every event is retried
        await _run(session.info.pop(_COMMIT_HOOKS, []))
        session.info.pop(_ROLLBACK_HOOKS, None)
    return outcomes


async def _apply_together(
    session: AsyncSession,
    inbox: Inbox,
    consumer: str,
    events: Sequence[DecodedEvent],
    todo: list[int],
    outcomes: list[Outcome],
) -> None:
    assert inbox.batch is not None
    if not todo:
        return
    for i in todo:
        outcomes[i] = Outcome(Fate.FAILED, "the batch failed")  # until the batch handler returns
    refused = await inbox.batch(session, [events[i] for i in todo])
    for i in todo:
        outcomes[i] = refused.get(events[i].event_id, APPLIED)
    back = [events[i].event_id for i in todo if outcomes[i] is not APPLIED]
    await release_events(session, inbox.table, consumer=consumer, event_ids=back)


async def _apply_one(session: AsyncSession, inbox: Inbox, consumer: str, event: DecodedEvent) -> Outcome:
    handler = inbox.handlers[type(event.payload)]
    hooks = [list(session.info.get(k, [])) for k in (_COMMIT_HOOKS, _ROLLBACK_HOOKS)]
    savepoint = await session.begin_nested()
    try:
        bind_ids(event.payload)
        with continued_from(dict(event.envelope.trace_context), f"consume {event.envelope.event_type}"):
            await handler(session, event)
        await savepoint.commit()
        return APPLIED
    except Exception as exc:
        await savepoint.rollback()  # the handler's writes go, and its claim below
        rolled_back = session.info.get(_ROLLBACK_HOOKS, [])[len(hooks[1]) :]
        session.info[_COMMIT_HOOKS], session.info[_ROLLBACK_HOOKS] = hooks
        await _run(rolled_back)
        await release_events(session, inbox.table, consumer=consumer, event_ids=[event.event_id])
        if isinstance(exc, (InvalidArgument, UndecodableEvent)):
            return Outcome(Fate.INVALID, str(exc))
        if isinstance(exc, NotYet):
            return Outcome(Fate.WAITING, str(exc))
        log.warning("handler_failed", consumer=consumer, event_id=event.event_id, error=repr(exc))
        return Outcome(failure_fate(exc), f"{type(exc).__name__}: {exc}")


async def give_up(inbox: Inbox, event: DecodedEvent, reason: str) -> None:
    """Let the service account for an event it will never apply, in a transaction of its own."""
    if inbox.on_give_up is None:
        return
    async with inbox.sessions() as session:
        async with session.begin():
            await inbox.on_give_up(session, event, reason)
        await _run(session.info.pop(_COMMIT_HOOKS, []))


async def _run(hooks: list[Callable[[], Any]]) -> None:
    """Run hooks in order; one that fails is logged and the rest still run (what they follow is
    committed, or rolled back, either way)."""
    for fn in hooks:
        try:
            result = fn()
            if isinstance(result, Awaitable):
                await result
        except Exception:
            log.exception("inbox_hook_failed", hook=getattr(fn, "__qualname__", repr(fn)))
