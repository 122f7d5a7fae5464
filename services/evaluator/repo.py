"""The evaluator's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table

SCHEMA = "evaluator"
metadata = sa.MetaData(schema=SCHEMA)

rewards = sa.Table(
    "rewards",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("score", sa.Float, nullable=False),
    sa.Column("assessable", sa.Boolean, nullable=False),
    sa.Column("grade", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

requests = RequestLog(requests_table(metadata))
"""GradeWorkspace's answers by request id (revision 0002 moved the older table onto this shape)."""

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


async def insert_reward(
    session: AsyncSession, *, execution_id: str, task_id: str, score: float, assessable: bool, grade: bytes
) -> bool:
    """Record an execution's reward; False when it already has one (rewarded once)."""
    stmt = (
        insert(rewards)
        .values(
            execution_id=uuid.UUID(execution_id),
            task_id=task_id,
            score=score,
            assessable=assessable,
            grade=grade,
        )
        .on_conflict_do_nothing()
        .returning(rewards.c.execution_id)
    )
    return (await session.execute(stmt)).first() is not None
