"""The scheduler's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table
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
)

executions = sa.Table(
    "executions",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey(tasks.c.task_id), nullable=False),
    sa.Column("index_in_group", sa.Integer, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
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
    spec = spec_from_record(row, labels=row.labels)
    planned = PlannedTask(
        task_id=str(row.task_id),
        spec=spec,
        executions=tuple(PlannedExecution(execution_id=str(e), index_in_group=i) for e, i in group),
        submitted_at=row.submitted_at,
    )
    return planned, row.state
