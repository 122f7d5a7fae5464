"""The trainer's own tables and their queries (shell: SQLAlchemy 2 async).

`ready_groups` is the queue of groups announced by `GroupReady`; a group's `consumed_version`
is set in the same transaction as the row of the step that trained it, so after a crash every
group is either in a committed step or still queued: never trained twice, never skipped. Each
step tried with a group counts in its `attempts` before it runs (so a process that dies in the
step still counts it); a group past the limit is set aside (`set_aside_at`, with the reason).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table

SCHEMA = "trainer"
metadata = sa.MetaData(schema=SCHEMA)

ready_groups = sa.Table(
    "ready_groups",
    metadata,
    sa.Column("task_id", sa.Uuid, primary_key=True),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
    sa.Column("execution_ids", JSONB, nullable=False),
    sa.Column("received_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("consumed_version", sa.Integer),
    sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("last_error", sa.Text),
    sa.Column("set_aside_at", sa.DateTime(timezone=True)),
)

steps = sa.Table(
    "steps",
    metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("task_ids", JSONB, nullable=False),
    sa.Column("checkpoint_uri", sa.Text, nullable=False),
    sa.Column("weights_uri", sa.Text, nullable=False),
    sa.Column("report", JSONB, nullable=False),
    sa.Column("completed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    # `batch_digest.batch_sha256` of the samples trained on, and what re-derives them:
    # `samples_request` (the StreamSamplesRequest as JSON) and `staleness` (the rule applied).
    # Null for steps recorded before revision 0002.
    sa.Column("batch_sha256", sa.Text),
    sa.Column("batch_recipe", JSONB),
)

checkpoints = sa.Table(
    "checkpoints",
    metadata,
    sa.Column("checkpoint_id", sa.Uuid, primary_key=True),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("uri", sa.Text, nullable=False),
    sa.Column("size_bytes", sa.BigInteger, nullable=False),
    sa.Column("saved_at", sa.DateTime(timezone=True), nullable=False),
)

requests = RequestLog(requests_table(metadata))

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedGroup:
    task_id: str
    execution_ids: tuple[str, ...]
    received_at: datetime
    attempts: int = 0
    """Steps already tried with it that did not complete."""
    last_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LastStep:
    version: int
    checkpoint_uri: str
    weights_uri: str


step_assignments = sa.Table(
    "step_assignments",
    metadata,
    sa.Column("task_id", sa.Uuid, primary_key=True),
    sa.Column("step", sa.Integer, nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False, unique=True),
)


async def record_assignment(session: AsyncSession, *, step: int, task_ids: list[str]) -> None:
    """The scheduler's assignment of groups to `step` (a repeat changes nothing)."""
    for task_id in task_ids:
        await session.execute(
            insert(step_assignments)
            .values(task_id=uuid.UUID(task_id), step=step)
            .on_conflict_do_nothing(index_elements=[step_assignments.c.task_id])
        )


async def assigned_groups(session: AsyncSession, *, up_to_step: int) -> list[QueuedGroup]:
    """Queued groups assigned to a step up to `up_to_step`, oldest step first, in assignment order.

    Not one set aside: it stays assigned here, and taken again it would hold its step forever
    (the scheduler gives the step another group). Attempts and the last error come along, so a
    group that keeps failing its step is set aside after `max_group_attempts` here too."""
    g, a = ready_groups.c, step_assignments.c
    stmt = (
        sa.select(g.task_id, g.execution_ids, g.received_at, g.attempts, g.last_error)
        .join(step_assignments, a.task_id == g.task_id)
        .where(g.consumed_version.is_(None), g.set_aside_at.is_(None), a.step <= up_to_step)
        .order_by(a.step, a.seq)
    )
    return [
        QueuedGroup(task_id=str(t), execution_ids=tuple(e), received_at=r, attempts=n, last_error=why)
        for t, e, r, n, why in (await session.execute(stmt)).all()
    ]


async def enqueue_group(session: AsyncSession, *, task_id: str, execution_ids: list[str]) -> None:
    """Queue a ready group; a group already known (queued or consumed) is left as it is."""
    await session.execute(
        insert(ready_groups)
        .values(task_id=uuid.UUID(task_id), execution_ids=execution_ids)
        .on_conflict_do_nothing()
    )


async def queued_groups(session: AsyncSession, *, limit: int | None = None) -> list[QueuedGroup]:
    """Unconsumed groups in arrival order: a step redone after a crash takes the same ones."""
    c = ready_groups.c
    stmt = (
        sa.select(c.task_id, c.execution_ids, c.received_at, c.attempts, c.last_error)
        .where(c.consumed_version.is_(None), c.set_aside_at.is_(None))
        .order_by(c.seq)
        .limit(limit)
    )
    return [
        QueuedGroup(task_id=str(t), execution_ids=tuple(e), received_at=r, attempts=a, last_error=why)
        for t, e, r, a, why in (await session.execute(stmt)).all()
    ]


async def count_attempt(session: AsyncSession, task_ids: list[str], *, delta: int = 1) -> None:
    """Count a step tried with these groups (delta -1 takes back one that failed for another
    reason than the groups: a dependency away, satellites lost)."""
    await session.execute(
        sa.update(ready_groups)
        .where(ready_groups.c.task_id.in_([uuid.UUID(t) for t in task_ids]))
        .values(attempts=ready_groups.c.attempts + delta)
    )


async def record_error(session: AsyncSession, task_ids: list[str], error: str) -> None:
    await session.execute(
        sa.update(ready_groups)
        .where(ready_groups.c.task_id.in_([uuid.UUID(t) for t in task_ids]))
        .values(last_error=error[:4000])
    )


async def set_aside(session: AsyncSession, task_id: str) -> None:
    await session.execute(
        sa.update(ready_groups)
        .where(ready_groups.c.task_id == uuid.UUID(task_id))
        .values(set_aside_at=sa.func.now())
    )


async def withdraw(session: AsyncSession, task_id: str) -> bool:
    """A cancelled task's group is never trained: set aside if still queued, and recorded set
    aside if its GroupReady is still to come (that then finds the row and changes nothing).
    False when a step already trained it."""
    row = (
        await session.execute(
            insert(ready_groups)
            .values(task_id=uuid.UUID(task_id), execution_ids=[], set_aside_at=sa.func.now())
            .on_conflict_do_update(
                index_elements=[ready_groups.c.task_id],
                set_={"set_aside_at": sa.func.coalesce(ready_groups.c.set_aside_at, sa.func.now())},
                where=ready_groups.c.consumed_version.is_(None),
            )
            .returning(ready_groups.c.task_id)
        )
    ).first()
    return row is not None


async def consume_groups(session: AsyncSession, *, task_ids: list[str], version: int) -> int:
    """Mark still-queued groups consumed at `version`; how many were."""
    updated = await session.execute(
        sa.update(ready_groups)
        .where(ready_groups.c.task_id.in_([uuid.UUID(t) for t in task_ids]))
        .where(ready_groups.c.consumed_version.is_(None))
        .values(consumed_version=version)
    )
    return int(updated.rowcount)  # type: ignore[attr-defined]


async def record_step(
    session: AsyncSession,
    *,
    version: int,
    task_ids: list[str],
    checkpoint_uri: str,
    weights_uri: str,
    report: dict[str, Any],
    batch_sha256: str,
    batch_recipe: dict[str, Any],
) -> None:
    consumed = await consume_groups(session, task_ids=task_ids, version=version)
    assert consumed == len(task_ids), "a group of the step was consumed elsewhere"
    await session.execute(
        sa.insert(steps).values(
            version=version,
            task_ids=task_ids,
            checkpoint_uri=checkpoint_uri,
            weights_uri=weights_uri,
            report=report,
            batch_sha256=batch_sha256,
            batch_recipe=batch_recipe,
        )
    )


async def load_step(session: AsyncSession, version: int) -> Any | None:
    return (await session.execute(sa.select(steps).where(steps.c.version == version))).first()


async def last_step(session: AsyncSession) -> LastStep | None:
    row = (await session.execute(sa.select(steps).order_by(steps.c.version.desc()).limit(1))).first()
    if row is None:
        return None
    return LastStep(version=row.version, checkpoint_uri=row.checkpoint_uri, weights_uri=row.weights_uri)


async def insert_checkpoint(
    session: AsyncSession, *, checkpoint_id: str, version: int, uri: str, size_bytes: int, saved_at: datetime
) -> None:
    await session.execute(
        sa.insert(checkpoints).values(
            checkpoint_id=uuid.UUID(checkpoint_id),
            version=version,
            uri=uri,
            size_bytes=size_bytes,
            saved_at=saved_at,
        )
    )


async def last_checkpoint(session: AsyncSession) -> Any | None:
    return (
        await session.execute(sa.select(checkpoints).order_by(checkpoints.c.saved_at.desc()).limit(1))
    ).first()


async def outbox_has(session: AsyncSession, event_id: str) -> bool:
    stmt = sa.select(outbox.c.event_id).where(outbox.c.event_id == uuid.UUID(event_id))
    return (await session.execute(stmt)).first() is not None
