"""The scheduler's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table
from services.scheduler.cells import CellRecord
from services.scheduler.tasks import SCALAR_SPEC_FIELDS, PlannedExecution, PlannedTask, spec_from_record

SCHEMA = "scheduler"
metadata = sa.MetaData(schema=SCHEMA)

tasks = sa.Table(
    "tasks",
    metadata,
    sa.Column("task_id", sa.Uuid, primary_key=True),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("prompt", sa.Text, nullable=False),
    sa.Column("group_size", sa.Integer, nullable=False),
    sa.Column("timeout_s", sa.Float, nullable=False),
    sa.Column("harness", sa.Text, nullable=False),
    sa.Column("workspace_template", sa.Text, nullable=False),
    sa.Column("labels", JSONB, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("seq", sa.BigInteger, sa.Identity(), nullable=False),
    sa.Column("admitted_version", sa.Integer, nullable=True),
    sa.Column("assigned_step", sa.Integer, nullable=True),
    sa.Column("trained_version", sa.Integer, nullable=True),
    sa.Column("deadline", sa.DateTime(timezone=True), nullable=True),
    sa.Column("max_infra_retries", sa.Integer, nullable=False),
    sa.Column("harness_env", JSONB, nullable=False),
)

executions = sa.Table(
    "executions",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey(tasks.c.task_id), nullable=False),
    sa.Column("index_in_group", sa.Integer, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("duration_s", sa.Float, nullable=True),
    sa.Column("replaces", sa.Uuid, nullable=True, unique=True),
    sa.Column("failure_reason", sa.Text, nullable=True),
    sa.UniqueConstraint("task_id", "index_in_group"),
)

requests = RequestLog(requests_table(metadata))

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


async def insert_tasks(session: AsyncSession, planned: Sequence[PlannedTask], *, request_id: str) -> None:
    await session.execute(
        sa.insert(tasks),
        [
            {
                "task_id": uuid.UUID(t.task_id),
                "request_id": request_id,
                **{name: getattr(t.spec, name) for name in SCALAR_SPEC_FIELDS},
                "labels": dict(t.spec.labels),
                "harness_env": dict(t.spec.harness_env),
                "deadline": t.spec.deadline,
                "state": "pending",
                "submitted_at": t.submitted_at,
            }
            for t in planned
        ],
    )
    await session.execute(
        sa.insert(executions),
        [
            {
                "execution_id": uuid.UUID(e.execution_id),
                "task_id": uuid.UUID(t.task_id),
                "index_in_group": e.index_in_group,
                "state": "pending",
            }
            for t in planned
            for e in t.executions
        ],
    )


async def load_task(session: AsyncSession, task_id: str) -> tuple[PlannedTask, str] | None:
    """The task and its state name, or None."""
    row = (await session.execute(sa.select(tasks).where(tasks.c.task_id == uuid.UUID(task_id)))).first()
    if row is None:
        return None
    group = (
        await session.execute(
            sa.select(executions.c.execution_id, executions.c.index_in_group)
            .where(executions.c.task_id == row.task_id)
            .order_by(executions.c.index_in_group)
        )
    ).all()
    return planned_task(row, [(str(e), i) for e, i in group]), row.state


def planned_task(row: sa.Row[Any], group: Sequence[tuple[str, int]]) -> PlannedTask:
    """A tasks row and its (execution_id, index_in_group) pairs, in group order, as a PlannedTask."""
    return PlannedTask(
        task_id=str(row.task_id),
        spec=spec_from_record(row, labels=row.labels, deadline=row.deadline, harness_env=row.harness_env),
        executions=tuple(PlannedExecution(execution_id=e, index_in_group=i) for e, i in group),
        submitted_at=row.submitted_at,
    )


cells = sa.Table(
    "cells",
    metadata,
    sa.Column("cell_id", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("target_role", sa.Text, nullable=False),
    sa.Column("core", sa.Boolean, nullable=False),
    sa.Column("slots", sa.Integer, nullable=False),
    sa.Column("model_fingerprint", sa.Text, nullable=False),
    sa.Column("engine_id", sa.Text, nullable=False),
    sa.Column("engine_address", sa.Text, nullable=False),
    sa.Column("agent_address", sa.Text, nullable=False),
    sa.Column("last_heartbeat_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False),
)

cluster = sa.Table(
    "cluster",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("mode", sa.Text, nullable=False),
    sa.Column("model_fingerprint", sa.Text, nullable=False),
    sa.Column("version", sa.Integer, nullable=False),
    sa.Column("version_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("trained_groups", sa.Integer, nullable=False),
    sa.Column("trained_tokens", sa.BigInteger, nullable=False),
    sa.Column("training_cell_s", sa.Float, nullable=False),
    sa.Column("pending_mode", sa.Text, nullable=True),
    sa.Column("pending_request_id", sa.Text, nullable=False),
)

CELL_FIELDS = tuple(f.name for f in dataclasses.fields(CellRecord))


def _cell(row: sa.Row[Any]) -> CellRecord:
    return CellRecord(**{name: getattr(row, name) for name in CELL_FIELDS})


async def load_cells(session: AsyncSession, *, for_update: bool = False) -> list[tuple[CellRecord, datetime]]:
    """Every cell with its last heartbeat, core first, then by id."""
    stmt = sa.select(cells).order_by(cells.c.core.desc(), cells.c.cell_id)
    if for_update:
        stmt = stmt.with_for_update()
    return [(_cell(row), row.last_heartbeat_at) for row in (await session.execute(stmt)).all()]


async def save_cell(
    session: AsyncSession, cell: CellRecord, *, now: datetime, registered: bool = False
) -> None:
    values = {name: getattr(cell, name) for name in CELL_FIELDS}
    stmt = insert(cells).values(**values, last_heartbeat_at=now, registered_at=now)
    update = {**values, "last_heartbeat_at": now, **({"registered_at": now} if registered else {})}
    await session.execute(stmt.on_conflict_do_update(index_elements=[cells.c.cell_id], set_=update))


async def set_role(session: AsyncSession, cell_id: str, *, role: str, target_role: str = "") -> None:
    await session.execute(
        sa.update(cells).where(cells.c.cell_id == cell_id).values(role=role, target_role=target_role)
    )


async def touch_cell(session: AsyncSession, cell_id: str, *, now: datetime) -> str | None:
    """Record a heartbeat; the cell's role, or None for an unknown cell."""
    stmt = (
        sa.update(cells)
        .where(cells.c.cell_id == cell_id)
        .values(last_heartbeat_at=now)
        .returning(cells.c.role)
    )
    row = (await session.execute(stmt)).first()
    return None if row is None else str(row.role)


async def load_cluster(
    session: AsyncSession, *, default_mode: str, for_update: bool = False
) -> tuple[str, str]:
    """(mode, model fingerprint); the row is created with `default_mode` on first use."""
    await session.execute(
        insert(cluster).values(id=1, mode=default_mode, model_fingerprint="").on_conflict_do_nothing()
    )
    stmt = sa.select(cluster.c.mode, cluster.c.model_fingerprint).where(cluster.c.id == 1)
    if for_update:
        stmt = stmt.with_for_update()
    row = (await session.execute(stmt)).one()
    return str(row.mode), str(row.model_fingerprint)


async def save_cluster(
    session: AsyncSession, *, mode: str | None = None, fingerprint: str | None = None
) -> None:
    values = {k: v for k, v in (("mode", mode), ("model_fingerprint", fingerprint)) if v is not None}
    await session.execute(sa.update(cluster).where(cluster.c.id == 1).values(**values))


async def step_in_progress(session: AsyncSession) -> bool:
    """Groups are assigned to the running step (index = the version) and not trained yet."""
    version = sa.select(cluster.c.version).where(cluster.c.id == 1).scalar_subquery()
    stmt = sa.select(tasks.c.task_id).where(
        tasks.c.assigned_step == version, tasks.c.state.not_in(("trained", "cancelled", "set_aside"))
    )
    return (await session.execute(stmt.limit(1))).first() is not None


async def pending_mode(session: AsyncSession) -> tuple[str | None, str]:
    """(the mode waiting for the running step's end, the SetMode request_id that asked for it)."""
    row = (
        await session.execute(
            sa.select(cluster.c.pending_mode, cluster.c.pending_request_id).where(cluster.c.id == 1)
        )
    ).first()
    return (None, "") if row is None else (row.pending_mode, row.pending_request_id)


async def save_pending_mode(session: AsyncSession, mode: str | None, *, request_id: str = "") -> None:
    await session.execute(
        sa.update(cluster)
        .where(cluster.c.id == 1)
        .values(pending_mode=mode, pending_request_id=request_id if mode else "")
    )


async def admit_task(session: AsyncSession, task_id: uuid.UUID, *, version: int) -> None:
    """The task and its executions are admitted at `version` (only from pending)."""
    await session.execute(
        sa.update(tasks)
        .where(tasks.c.task_id == task_id, tasks.c.state == "pending")
        .values(state="admitted", admitted_version=version)
    )
    await session.execute(
        sa.update(executions)
        .where(executions.c.task_id == task_id, executions.c.state == "pending")
        .values(state="admitted")
    )


async def assign_step(session: AsyncSession, *, seqs: Sequence[int], step: int) -> list[str]:
    """Record the tasks (by `seq`) as assigned to `step`; their ids, in the given order."""
    rows = await session.execute(
        sa.update(tasks)
        .where(tasks.c.seq.in_(seqs))
        .values(assigned_step=step)
        .returning(tasks.c.seq, tasks.c.task_id)
    )
    by_seq = {seq: str(task_id) for seq, task_id in rows.all()}
    return [by_seq[s] for s in seqs if s in by_seq]


async def current_version(session: AsyncSession) -> int:
    return int(await session.scalar(sa.select(sa.func.coalesce(sa.func.max(cluster.c.version), 0))) or 0)


async def cancel_queued(session: AsyncSession, task_id: uuid.UUID) -> None:
    """A task not admitted yet will never be: it and its executions are cancelled."""
    await session.execute(
        sa.update(tasks)
        .where(tasks.c.task_id == task_id, tasks.c.state == "pending")
        .values(state="cancelled")
    )
    await session.execute(
        sa.update(executions)
        .where(executions.c.task_id == task_id, executions.c.state == "pending")
        .values(state="cancelled")
    )
