"""The trajectory service's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.tables import outbox_table, processed_messages_table

SCHEMA = "trajectory"
metadata = sa.MetaData(schema=SCHEMA)

groups = sa.Table(
    "groups",
    metadata,
    sa.Column("task_id", sa.Uuid, primary_key=True),
    sa.Column("family", sa.Text, nullable=False),
    sa.Column("group_size", sa.Integer, nullable=False),
    sa.Column("registered_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("ready_at", sa.DateTime(timezone=True)),
)

group_executions = sa.Table(
    "group_executions",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey(groups.c.task_id), nullable=False),
    sa.Column("index_in_group", sa.Integer, nullable=False),
    sa.Column("reward", sa.Float),
    sa.UniqueConstraint("task_id", "index_in_group"),
)

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMember:
    execution_id: str
    index_in_group: int
    reward: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord:
    task_id: str
    family: str
    group_size: int
    registered_at: datetime
    members: tuple[GroupMember, ...]


async def register_group(
    session: AsyncSession, *, task_id: str, family: str, members: list[tuple[str, int]]
) -> None:
    """Insert a group and its executions; an existing group is left as it is."""
    await session.execute(
        insert(groups)
        .values(task_id=uuid.UUID(task_id), family=family, group_size=len(members))
        .on_conflict_do_nothing()
    )
    await session.execute(
        insert(group_executions).on_conflict_do_nothing(),
        [
            {"execution_id": uuid.UUID(e), "task_id": uuid.UUID(task_id), "index_in_group": i}
            for e, i in members
        ],
    )


async def load_group(session: AsyncSession, task_id: str) -> GroupRecord | None:
    row = (await session.execute(sa.select(groups).where(groups.c.task_id == uuid.UUID(task_id)))).first()
    if row is None:
        return None
    members = (
        await session.execute(
            sa.select(
                group_executions.c.execution_id, group_executions.c.index_in_group, group_executions.c.reward
            )
            .where(group_executions.c.task_id == row.task_id)
            .order_by(group_executions.c.index_in_group)
        )
    ).all()
    return GroupRecord(
        task_id=str(row.task_id),
        family=row.family,
        group_size=row.group_size,
        registered_at=row.registered_at,
        members=tuple(GroupMember(execution_id=str(e), index_in_group=i, reward=r) for e, i, r in members),
    )
