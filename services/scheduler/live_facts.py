"""The live facts, read back from the scheduler's own tables into a `LiveFacts` (shell: SQL).

The tables hold the outcome of every fact the scheduler has seen (roles, admissions with their
version, execution states and durations, readiness, assignments, the trainer's version), so the
fold is rebuilt from them on every decision: a restarted scheduler decides from where it was.
The facts are replayed in the order they happened (admission order), through the fold's own
methods, as the simulator reports them.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from services.scheduler import repo
from services.scheduler.cells import CellRecord
from services.scheduler.live_view import LiveFacts

STARTED = (
    "running",
    "finished",
    "timed_out",
    "failed",
    "cancelled",
    "graded",
    "trained",
    "set_aside",
    "infra_failed",
)
ENDED = STARTED[1:]
GONE = ("trained", "set_aside")
"""Groups out of the ready pool: trained, or set aside by the trainer (their step takes others)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    mode: str
    version: int
    version_at: datetime | None
    trained_groups: int
    trained_tokens: int
    training_cell_s: float

    def tokens_per_group(self, *, guess: int) -> int:
        """Mean target tokens of the groups trained so far (a group's own count is known only then)."""
        return self.trained_tokens // self.trained_groups if self.trained_groups else guess

    def tokens_per_s_per_cell(self, *, guess: float) -> float:
        return self.trained_tokens / self.training_cell_s if self.training_cell_s > 0 else guess


@dataclass(frozen=True, slots=True, kw_only=True)
class Queued:
    seq: int
    task_id: uuid.UUID
    group_size: int


async def load_cluster(session: AsyncSession, *, default_mode: str) -> Cluster:
    await repo.load_cluster(session, default_mode=default_mode)
    row = (await session.execute(sa.select(repo.cluster).where(repo.cluster.c.id == 1))).one()
    return Cluster(
        mode=row.mode,
        version=row.version,
        version_at=row.version_at,
        trained_groups=row.trained_groups,
        trained_tokens=row.trained_tokens,
        training_cell_s=row.training_cell_s,
    )


def cell_roles(facts: LiveFacts, cells: list[CellRecord]) -> None:
    for cell in cells:
        if cell.role in ("rollout", "training"):
            facts.cell_role(cell.cell_id, cell.role)
        elif cell.role == "switching":
            facts.cell_role(cell.cell_id, f"to_{cell.target_role}")


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskRow:
    """A task not yet out of the ready pool, as the fold reads it."""

    seq: int
    task_id: uuid.UUID
    state: str
    group_size: int
    admitted_version: int | None
    assigned_step: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class GoneGroups:
    """The groups out of the ready pool (trained or set aside), summed: all the fold needs of them."""

    count: int = 0
    duration_s: float = 0.0  # their executions' durations, summed
    max_group_size: int = 0


async def load_facts(
    session: AsyncSession,
    *,
    cluster: Cluster,
    cells: list[CellRecord],
    slots_per_cell: int,
    tokens_per_group: int,
    tokens_per_s_per_cell: float,
) -> tuple[LiveFacts, list[Queued]]:
    """The fold as of now, and the tasks still queued (not admitted), oldest first.

    Groups out of the ready pool are read as one sum (`GoneGroups`), so a decision reads the
    tasks still in play, not the run's whole history (thousands of executions per step)."""
    t, e = repo.tasks.c, repo.executions.c
    in_play = sa.and_(t.state != "cancelled", t.state.not_in(GONE))
    tasks = [
        TaskRow(
            seq=r.seq,
            task_id=r.task_id,
            state=r.state,
            group_size=r.group_size,
            admitted_version=r.admitted_version,
            assigned_step=r.assigned_step,
        )
        for r in (
            await session.execute(
                sa.select(t.seq, t.task_id, t.state, t.group_size, t.admitted_version, t.assigned_step)
                .where(in_play)
                .order_by(t.seq)
            )
        ).all()
    ]
    rows = (
        await session.execute(
            sa.select(e.task_id, e.state, e.duration_s)
            .join(repo.tasks, t.task_id == e.task_id)
            .where(t.admitted_version.is_not(None), in_play)
        )
    ).all()
    members: dict[uuid.UUID, list[tuple[str, float]]] = {}
    for row in rows:
        members.setdefault(row.task_id, []).append((row.state, row.duration_s or 0.0))
    gone_tasks = sa.select(t.task_id, t.group_size).where(t.state.in_(GONE)).subquery()
    gone = (
        await session.execute(
            sa.select(
                sa.select(sa.func.count()).select_from(gone_tasks).scalar_subquery(),
                sa.select(sa.func.coalesce(sa.func.max(gone_tasks.c.group_size), 0)).scalar_subquery(),
                sa.select(sa.func.coalesce(sa.func.sum(e.duration_s), 0.0))
                .where(e.task_id.in_(sa.select(gone_tasks.c.task_id)))
                .scalar_subquery(),
            )
        )
    ).one()
    return fold_facts(
        tasks,
        members,
        gone=GoneGroups(count=gone[0], max_group_size=gone[1], duration_s=float(gone[2])),
        cluster=cluster,
        cells=cells,
        slots_per_cell=slots_per_cell,
        tokens_per_group=tokens_per_group,
        tokens_per_s_per_cell=tokens_per_s_per_cell,
    )


def fold_facts(
    tasks: list[TaskRow],
    members: dict[uuid.UUID, list[tuple[str, float]]],
    *,
    gone: GoneGroups,
    cluster: Cluster,
    cells: list[CellRecord],
    slots_per_cell: int,
    tokens_per_group: int,
    tokens_per_s_per_cell: float,
) -> tuple[LiveFacts, list[Queued]]:
    """The fold of the tasks in play (in `seq` order, with their executions' states and
    durations) after the groups already gone (pure)."""
    facts = LiveFacts(
        total_groups=len(tasks) + gone.count,
        group_size=max([gone.max_group_size, *(r.group_size for r in tasks)]) or 1,
        slots_per_cell=slots_per_cell,
        tokens_per_s_per_cell=tokens_per_s_per_cell,
    )
    cell_roles(facts, cells)
    facts.groups_gone(gone.count, duration_s=gone.duration_s, tokens_per_group=tokens_per_group)
    queued: list[Queued] = []
    assigned: list[int] = []
    for task in tasks:
        if task.admitted_version is None:
            queued.append(Queued(seq=task.seq, task_id=task.task_id, group_size=task.group_size))
            continue
        facts.version = task.admitted_version
        states = members.get(task.task_id, [])
        # Replacements of infrastructure failures are members too: the group waits for them.
        facts.group_admitted(task.seq, size=max(task.group_size, len(states)))
        # A ready group's executions all ended, whatever order the runner's and the trajectory
        # service's streams arrived in (they are not ordered with each other).
        ready = task.state == "graded"
        for state, _ in states:
            if ready or state in STARTED:
                facts.execution_started()
            if ready or state in ENDED:
                facts.execution_ended(task.seq)
        if ready:
            facts.group_ready(task.seq, tokens=tokens_per_group, duration_s=sum(d for _, d in states))
            if task.assigned_step == cluster.version:
                assigned.append(task.seq)
    facts.version = cluster.version
    facts.groups_assigned(assigned)
    facts.starved_since_s = (
        None if assigned else (cluster.version_at.timestamp() if cluster.version_at else 0.0)
    )
    return facts, queued
