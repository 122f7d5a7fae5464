"""The evaluator's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

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

rpc_requests = sa.Table(
    "rpc_requests",
    metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("fingerprint", sa.LargeBinary, nullable=False),
    sa.Column("response", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

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


async def claim_request(
    session: AsyncSession, *, request_id: str, fingerprint: bytes, response: bytes
) -> bool:
    stmt = (
        insert(rpc_requests)
        .values(request_id=request_id, fingerprint=fingerprint, response=response)
        .on_conflict_do_nothing()
        .returning(rpc_requests.c.request_id)
    )
    return (await session.execute(stmt)).first() is not None


async def load_request(session: AsyncSession, request_id: str) -> tuple[bytes, bytes] | None:
    row = (
        await session.execute(
            sa.select(rpc_requests.c.fingerprint, rpc_requests.c.response).where(
                rpc_requests.c.request_id == request_id
            )
        )
    ).first()
    return None if row is None else (row.fingerprint, row.response)
