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
    sa.Column("max_infra_retries", sa.Integer, nullable=False, server_default="0"),
)

group_executions = sa.Table(
    "group_executions",
    metadata,
    sa.Column("execution_id", sa.Uuid, primary_key=True),
    sa.Column("task_id", sa.Uuid, sa.ForeignKey(groups.c.task_id), nullable=False),
    sa.Column("index_in_group", sa.Integer, nullable=False),
    sa.Column("reward", sa.Float),
    sa.Column("replaces", sa.Uuid),
    sa.Column("replacement_decided", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.UniqueConstraint("task_id", "index_in_group"),
)

# Created by migration 0002 (raw SQL writes it); declared here for typed reads.
rewards = sa.Table(
    "rewards",
    metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("reward", sa.Float, nullable=False),
    sa.Column("assessable", sa.Boolean, nullable=False),
    sa.Column("partial", sa.Boolean, nullable=False),
)

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupMember:
    execution_id: str
    index_in_group: int
    reward: float | None
    assessable: bool = True
    """False when its grade was not assessable (an infrastructure failure)."""
    replaces: str = ""
    """For a replacement: the failed execution it replaces."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupRecord:
    task_id: str
    family: str
    group_size: int
    registered_at: datetime
    ready_at: datetime | None
    members: tuple[GroupMember, ...]
    max_infra_retries: int = 0


async def register_group(
    session: AsyncSession,
    *,
    task_id: str,
    family: str,
    members: list[tuple[str, int]],
    max_infra_retries: int = 0,
) -> None:
    """Insert a group and its executions; an existing group is left as it is."""
    await session.execute(
        insert(groups)
        .values(
            task_id=uuid.UUID(task_id),
            family=family,
            group_size=len(members),
            max_infra_retries=max_infra_retries,
        )
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
                group_executions.c.execution_id,
                group_executions.c.index_in_group,
                group_executions.c.reward,
                sa.func.coalesce(rewards.c.assessable, True),
                group_executions.c.replaces,
            )
            .select_from(
                group_executions.outerjoin(
                    rewards, rewards.c.execution_id == sa.cast(group_executions.c.execution_id, sa.Text)
                )
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
        ready_at=row.ready_at,
        members=tuple(
            GroupMember(execution_id=str(e), index_in_group=i, reward=r, assessable=a, replaces=str(x or ""))
            for e, i, r, a, x in members
        ),
        max_infra_retries=row.max_infra_retries,
    )


async def record_replacement_decision(
    session: AsyncSession, *, task_id: str, execution_id: str, replacement: tuple[str, int] | None
) -> bool:
    """The scheduler decided about an unassessable member: mark it decided and add its
    replacement (execution id, index in group), if any, to the group. False when the group is
    not known here (yet)."""
    known = await session.scalar(sa.select(groups.c.task_id).where(groups.c.task_id == uuid.UUID(task_id)))
    if known is None:
        return False
    await session.execute(
        sa.update(group_executions)
        .where(group_executions.c.execution_id == uuid.UUID(execution_id))
        .values(replacement_decided=True)
    )
    if replacement is not None:
        await session.execute(
            insert(group_executions)
            .values(
                execution_id=uuid.UUID(replacement[0]),
                task_id=uuid.UUID(task_id),
                index_in_group=replacement[1],
                replaces=uuid.UUID(execution_id),
            )
            .on_conflict_do_nothing()
        )
    return True


async def record_reward(
    session: AsyncSession,
    *,
    execution_id: str,
    task_id: str,
    reward: float,
    assessable: bool,
    partial: bool,
    num_calls_expected: int | None = None,
) -> bool:
    """Store an execution's reward (the first one wins); False when it already had one.

    `num_calls_expected` is how many calls the proxy recorded for it (None: not known); the group
    is not ready before that many are stored.
    """
    inserted = (
        await session.execute(
            sa.text(
                "INSERT INTO trajectory.rewards (execution_id, task_id, reward, assessable, partial, "
                "num_calls_expected) VALUES (:e, :t, :r, :a, :p, :n) ON CONFLICT DO NOTHING "
                "RETURNING execution_id"
            ),
            {
                "e": execution_id,
                "t": task_id,
                "r": reward,
                "a": assessable,
                "p": partial,
                "n": num_calls_expected,
            },
        )
    ).first()
    if inserted is None:
        return False
    await session.execute(
        sa.update(group_executions)
        .where(group_executions.c.execution_id == uuid.UUID(execution_id))
        .values(reward=reward)
    )
    return True


async def mark_ready_if_complete(session: AsyncSession, task_id: str) -> list[str] | None:
    """Mark the group ready when every execution has a reward and every call the proxy recorded
    for it is stored; its execution ids, once, else None.

    An unassessable member (an infrastructure failure) is accounted for only once the scheduler's
    decision about a replacement is known (the replacement is then a member to wait for), or once
    the group's allowance is spent (`max_infra_retries` replacements added; with 0, at once): a
    group that became ready first would train without its replacement.

    Calls and rewards come on streams that are not ordered with each other, so a reward can be
    in while calls are still on the bus: the stored count must reach the expected one, whichever
    of the two events comes last runs this check (both under the group's lock). A call refused
    for good (dead-lettered, in `refused_calls`) counts as accounted for: the group trains
    without it rather than waiting for it forever.
    """
    # The group's registration and its last reward arrive on different streams and may commit at
    # the same moment; neither would see the other's rows and the group would never be ready.
    # Serialising the check per task means the later transaction sees the earlier one's commit.
    await session.execute(
        sa.text("SELECT pg_advisory_xact_lock(hashtextextended(:t, 0))"), {"t": f"trajectory-group:{task_id}"}
    )
    # Fill rewards that arrived before the group was known, so GetGroup shows them
    # (also while the group still waits for calls).
    await session.execute(
        sa.text(
            "UPDATE trajectory.group_executions ge SET reward = r.reward FROM trajectory.rewards r "
            "WHERE ge.task_id = :t AND r.execution_id = ge.execution_id::text AND ge.reward IS NULL"
        ),
        {"t": uuid.UUID(task_id)},
    )
    rows = (
        await session.execute(
            sa.text(
                "SELECT ge.execution_id::text AS execution_id, r.reward IS NOT NULL AS rewarded, "
                "r.num_calls_expected IS NULL OR COALESCE(x.num_calls, 0) + (SELECT count(*) FROM "
                "trajectory.refused_calls rc WHERE rc.execution_id = ge.execution_id::text) "
                ">= r.num_calls_expected "
                "AS calls_stored, "
                "COALESCE(r.assessable, true) OR ge.replacement_decided OR g.max_infra_retries <= "
                "(SELECT count(*) FROM trajectory.group_executions rp WHERE rp.task_id = ge.task_id "
                "AND rp.replaces IS NOT NULL) AS settled "
                "FROM trajectory.group_executions ge "
                "JOIN trajectory.groups g ON g.task_id = ge.task_id "
                "LEFT JOIN trajectory.rewards r ON r.execution_id = ge.execution_id::text "
                "LEFT JOIN trajectory.executions x ON x.execution_id = ge.execution_id::text "
                "WHERE ge.task_id = :t ORDER BY ge.index_in_group"
            ),
            {"t": uuid.UUID(task_id)},
        )
    ).all()
    if not rows or not all(r.rewarded and r.calls_stored and r.settled for r in rows):
        return None
    marked = (
        await session.execute(
            sa.update(groups)
            .where(groups.c.task_id == uuid.UUID(task_id), groups.c.ready_at.is_(None))
            .values(ready_at=sa.func.now())
            .returning(groups.c.task_id)
        )
    ).first()
    return [r.execution_id for r in rows] if marked is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownOutcome:
    execution_id: str
    task_id: str
    """Empty when the execution belongs to no known group."""
    reward: float | None
    assessable: bool
    """False when its grade was not assessable; True also while it has no reward."""
    group_rewards: dict[str, float]
    """Rewards of every assessable rewarded execution of its group (itself included): the baseline."""


async def load_outcomes(session: AsyncSession, execution_ids: list[str]) -> dict[str, KnownOutcome]:
    rows = (
        await session.execute(
            sa.text(
                "WITH wanted AS (SELECT unnest(CAST(:ids AS text[])) AS execution_id), "
                "membership AS (SELECT w.execution_id, ge.task_id FROM wanted w "
                "  LEFT JOIN trajectory.group_executions ge ON ge.execution_id::text = w.execution_id) "
                "SELECT m.execution_id AS wanted, m.task_id::text AS task_id, "
                "  ge.execution_id::text AS member, r.reward AS member_reward, "
                "  r.assessable AS member_assessable, "
                "  own.reward AS own_reward, COALESCE(own.assessable, true) AS own_assessable "
                "FROM membership m "
                "LEFT JOIN trajectory.rewards own ON own.execution_id = m.execution_id "
                "LEFT JOIN trajectory.group_executions ge ON ge.task_id = m.task_id "
                "LEFT JOIN trajectory.rewards r ON r.execution_id = ge.execution_id::text"
            ),
            {"ids": execution_ids},
        )
    ).all()
    outcomes: dict[str, KnownOutcome] = {}
    for r in rows:
        known = outcomes.get(r.wanted) or KnownOutcome(
            execution_id=r.wanted,
            task_id=r.task_id or "",
            reward=r.own_reward,
            assessable=r.own_assessable,
            group_rewards={},
        )
        # An unassessable member (infrastructure failure) is no sample of the policy: leaving it
        # in the baseline as 0 would push every assessable member's advantage up.
        if r.member is not None and r.member_reward is not None and r.member_assessable:
            known.group_rewards[r.member] = r.member_reward
        outcomes[r.wanted] = known
    return outcomes


async def count_replacements(session: AsyncSession, task_id: str) -> int:
    """Members of the group that replace an infrastructure failure."""
    ge = group_executions.c
    stmt = sa.select(sa.func.count()).where(ge.task_id == uuid.UUID(task_id), ge.replaces.is_not(None))
    return int(await session.scalar(stmt) or 0)


async def unassessable_executions(session: AsyncSession, execution_ids: list[str]) -> set[str]:
    """The executions among `execution_ids` whose grade was not assessable."""
    rows = await session.execute(
        sa.select(rewards.c.execution_id).where(
            rewards.c.execution_id.in_(execution_ids), rewards.c.assessable.is_(False)
        )
    )
    return {r.execution_id for r in rows}


async def group_members(session: AsyncSession, task_id: str) -> tuple[bool, list[str]] | None:
    """(ready, execution ids in group order) of a known group, else None."""
    record = await load_group(session, task_id)
    if record is None:
        return None
    return record.ready_at is not None, [m.execution_id for m in record.members]


async def waiting_groups_of(session: AsyncSession, execution_ids: list[str]) -> list[str]:
    """Task ids of the groups, not yet ready, that the given executions belong to."""
    rows = (
        await session.execute(
            sa.text(
                "SELECT DISTINCT g.task_id::text AS task_id FROM trajectory.group_executions ge "
                "JOIN trajectory.groups g ON g.task_id = ge.task_id "
                "WHERE ge.execution_id::text = ANY(CAST(:ids AS text[])) AND g.ready_at IS NULL "
                "ORDER BY 1"
            ),
            {"ids": execution_ids},
        )
    ).all()
    return [r.task_id for r in rows]


async def refuse_calls(session: AsyncSession, refused: list[tuple[str, str, str]]) -> None:
    """Record (call_id, execution_id, reason) of calls dead-lettered for good."""
    await session.execute(
        sa.text(
            "INSERT INTO trajectory.refused_calls (call_id, execution_id, reason) "
            "VALUES (:c, :e, :r) ON CONFLICT DO NOTHING"
        ),
        [{"c": c, "e": e, "r": r[:2000]} for c, e, r in refused],
    )
