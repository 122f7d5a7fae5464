"""The runner's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table
from services.runner.executions import Launch

SCHEMA = "runner"
metadata = sa.MetaData(schema=SCHEMA)

executions = sa.Table(
    "executions",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Uuid, nullable=False),
    sa.Column("index_in_group", sa.Integer, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("harness", sa.Text, nullable=False),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("task", sa.Text, nullable=False),
    sa.Column("timeout_s", sa.Float, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("workspace_uri", sa.Text, nullable=False, server_default=""),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("deadline", sa.DateTime(timezone=True)),
    sa.Column("ended_at", sa.DateTime(timezone=True)),
    sa.Column("exit_code", sa.Integer),
    sa.Column("failure_kind", sa.Text, nullable=False, server_default=""),
    sa.Column("failure_reason", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

requests = RequestLog(requests_table(metadata))
"""StartExecution's and CancelExecution's answers by request id (revision 0002 moved the older
table, which kept only the execution id, onto this shape)."""

cancelled_early = sa.Table(
    "cancelled_early",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


async def insert_execution(session: AsyncSession, launch: Launch) -> bool:
    """Record a new execution as starting; False when its id was already taken."""
    stmt = (
        insert(executions)
        .values(
            execution_id=uuid.UUID(launch.execution_id),
            task_id=uuid.UUID(launch.task_id),
            index_in_group=launch.index_in_group,
            request_id=launch.request_id,
            harness=launch.harness,
            family=launch.family,
            task=launch.task,
            timeout_s=launch.timeout_s,
            state="starting",
        )
        .on_conflict_do_nothing()
        .returning(executions.c.execution_id)
    )
    return (await session.execute(stmt)).first() is not None


async def load_execution(session: AsyncSession, execution_id: str) -> Any | None:
    stmt = sa.select(executions).where(executions.c.execution_id == uuid.UUID(execution_id))
    return (await session.execute(stmt)).first()


async def update_execution(session: AsyncSession, execution_id: str, **values: Any) -> None:
    await session.execute(
        sa.update(executions).where(executions.c.execution_id == uuid.UUID(execution_id)).values(**values)
    )


async def unfinished(session: AsyncSession) -> list[Any]:
    """Executions a previous runner process left starting or running."""
    stmt = sa.select(executions).where(executions.c.state.in_(("starting", "running")))
    return list((await session.execute(stmt)).all())


async def ended_since(session: AsyncSession, within_s: float) -> list[Any]:
    """Executions that ended within the last `within_s` seconds (their workspace may await a grade)."""
    stmt = sa.select(executions).where(
        executions.c.state.notin_(("starting", "running")),
        executions.c.ended_at > sa.func.now() - sa.text("make_interval(secs => :s)").bindparams(s=within_s),
    )
    return list((await session.execute(stmt)).all())


async def lock_execution(session: AsyncSession, execution_id: str) -> None:
    """Serialise, per execution, a cancel that comes before the runner knows it with its start."""
    await session.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtext(execution_id))))


async def cancel_early(session: AsyncSession, execution_id: str, *, reason: str, request_id: str) -> None:
    await session.execute(
        insert(cancelled_early)
        .values(execution_id=uuid.UUID(execution_id), reason=reason, request_id=request_id)
        .on_conflict_do_nothing()
    )


async def cancelled_before_start(session: AsyncSession, execution_id: str) -> tuple[str, str] | None:
    """(reason, request_id) when a CancelExecution came before the execution was scheduled here."""
    row = (
        await session.execute(
            sa.select(cancelled_early.c.reason, cancelled_early.c.request_id).where(
                cancelled_early.c.execution_id == uuid.UUID(execution_id)
            )
        )
    ).first()
    return None if row is None else (row.reason, row.request_id)
