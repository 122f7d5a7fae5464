"""Infrastructure failures: recorded on their execution, and a replacement scheduled in the same
group while the task's allowance lasts (shell: SQL + outbox, in the lifecycle consumer's transaction).

The trigger is the evaluator's `RewardAssigned` with `assessable = false`: every runner end with an
infrastructure cause (workspace, sandbox, harness launch, proxy, runner lost) becomes one, and so
does a grader that crashed, so one event covers both and the trajectory service, which sees the
same grades, agrees on which executions failed this way.

The scheduler's `watchdog` takes the same path for an execution no runner reported an end for
(`record_lost`): no grade comes for it, so its decision says `lost`.

An execution cancelled alone (`gyre cancel EXECUTION`) is graded unassessable too, its grade
flagged `cancelled`: it is recorded `cancelled` with the reason, never replaced, and the decision
(no replacement, `cancelled: true`) lets its group train without it (`policy.liveness`).

Exactly once: the event is claimed in the inbox with these writes; an execution's failure is
recorded only while its `failure_reason` is empty (a second grade for it, under another event
id, changes nothing), and `executions.replaces` is unique. Every handled failure publishes one
`ExecutionReplacementDecided` (with the replacement, or why none), which the trajectory service
waits for before it calls the group ready.

The replacement joins the group already admitted (its admission version stays the group's): the
admission cap counts groups, so it is unchanged, and the replacement's tokens are newer than the
group's admission, so the staleness bound still holds; a step waits for a due group's
replacement as it waits for any of its running executions.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.common.v1 import ids_pb2
from gyre.common.v1.envelope_pb2 import Envelope
from gyre.evaluator.v1 import evaluator_pb2
from gyre.events import new_event
from gyre.ids import new_uuid7
from gyre.scheduler.v1 import events_pb2
from services.scheduler import repo
from services.scheduler.codec import execution_scheduled, task_to_proto
from services.scheduler.retries import decide_replacement
from services.scheduler.tasks import execution_limit_s

log = structlog.get_logger(__name__)
PRODUCER = "scheduler"
FAILED_FROM = ("pending", "admitted", "running", "finished", "timed_out", "failed", "trained", "set_aside")
"""States an infrastructure failure is recorded from: the grade may come before the runner's end
event, and, where no retry was allowed, after the trainer's step (the trajectory service did not
wait for this decision): the streams are not ordered with each other. Not `graded`: that was an
assessable grade."""


async def record_unassessable(
    session: AsyncSession, grade: evaluator_pb2.Grade, *, causation_id: str
) -> list[Envelope]:
    """Record an unassessable grade on its execution; the events to enqueue (none when the
    execution is unknown here or its failure was recorded before)."""
    return await _record_failure(
        session,
        execution_id=grade.execution_id,
        reason=grade.unassessable_reason or "the grade was not assessable",
        flagged_cancelled=grade.cancelled,
        lost=False,
        causation_id=causation_id,
    )


async def record_lost(
    session: AsyncSession, execution_id: str, *, reason: str, causation_id: str
) -> list[Envelope]:
    """The watchdog ends an execution no runner reported an end for: an infrastructure failure
    like an unassessable grade, but no grade will come, so the decision says `lost` and the
    trajectory service counts the member as not assessable without waiting for its reward."""
    return await _record_failure(
        session,
        execution_id=execution_id,
        reason=reason,
        flagged_cancelled=False,
        lost=True,
        causation_id=causation_id,
        only_from=("admitted", "running"),  # an end that came meanwhile is the runner's word
    )


async def _record_failure(
    session: AsyncSession,
    *,
    execution_id: str,
    reason: str,
    flagged_cancelled: bool,
    lost: bool,
    causation_id: str,
    only_from: tuple[str, ...] = (),
) -> list[Envelope]:
    try:
        key = uuid.UUID(execution_id)
    except ValueError:
        return []
    e, t = repo.executions.c, repo.tasks.c
    row = (
        await session.execute(
            sa.select(e.task_id, e.index_in_group, e.state, t.state.label("task_state"), t.max_infra_retries)
            .join(repo.tasks, t.task_id == e.task_id)
            .where(e.execution_id == key)
            .with_for_update(of=repo.tasks)  # one decision at a time per group: the count below holds
        )
    ).first()
    if row is None:
        return []
    task_cancelled = row.task_state == "cancelled"
    # One execution cancelled (`gyre cancel EXECUTION`): the evaluator flags its grade, since
    # the runner's end event may reach this service after the grade. Its own state says so too.
    alone = not task_cancelled and (flagged_cancelled or row.state == "cancelled")
    cancelled = task_cancelled or alone
    # A cancelled task's executions are graded unassessable too; that is no infrastructure
    # failure and never replaced, but the trajectory service still waits for the answer. A
    # cancelled execution of a live group is neither: it stays `cancelled`, with the reason,
    # and the answer (no replacement) lets its group train without it.
    if task_cancelled:
        state: object = sa.case((e.state == "cancelled", "graded"), else_=e.state)
    else:
        state = "cancelled" if alone else "infra_failed"
    allowed = only_from or ((*FAILED_FROM, "cancelled") if cancelled else FAILED_FROM)
    moved = (
        await session.execute(
            sa.update(repo.executions)
            .where(e.execution_id == key, e.failure_reason.is_(None), e.state.in_(allowed))
            .values(state=state, failure_reason=reason[:4096])
            .returning(e.execution_id)
        )
    ).first()
    if moved is None:
        return []
    found = await repo.load_task(session, str(row.task_id))
    assert found is not None
    planned, _ = found
    used = await session.scalar(
        sa.select(sa.func.count()).where(e.task_id == row.task_id, e.replaces.is_not(None))
    )
    now = datetime.now(UTC)
    limit_s = execution_limit_s(planned.spec, now=now)
    decision = decide_replacement(
        task_state=row.task_state,
        max_infra_retries=row.max_infra_retries,
        num_replacements=int(used or 0),
        limit_s=limit_s,
        execution_cancelled=alone,
    )
    failed = ids_pb2.ExecutionRef(
        task_id=str(row.task_id), execution_id=execution_id, index_in_group=row.index_in_group
    )
    decided = events_pb2.ExecutionReplacementDecided(
        execution=failed,
        reason=reason if decision.replace else f"{reason}; not replaced: {decision.reason}",
        num_replacements=int(used or 0),
        max_infra_retries=row.max_infra_retries,
        cancelled=cancelled,
        lost=lost,
    )
    events = []
    if decision.replace:
        replacement = await _insert_replacement(session, row.task_id, replaces=key)
        decided.replacement.CopyFrom(replacement)
        decided.num_replacements += 1
        version = await repo.current_version(session)  # admitted now: its calls use weights this new
        scheduled = execution_scheduled(
            task_to_proto(planned), replacement, admitted_version=version, timeout_s=limit_s
        )
        events.append(
            new_event(scheduled, producer=PRODUCER, correlation_id=failed.task_id, causation_id=causation_id)
        )
    events.append(
        new_event(decided, producer=PRODUCER, correlation_id=failed.task_id, causation_id=causation_id)
    )
    log.warning(
        "infra_failure_recorded",
        execution_id=execution_id,
        task_id=failed.task_id,
        replacement=decided.replacement.execution_id if decision.replace else "",
        num_replacements=decided.num_replacements,
        max_infra_retries=row.max_infra_retries,
        reason=decided.reason[:300],
    )
    return events


async def _insert_replacement(
    session: AsyncSession, task_id: uuid.UUID, *, replaces: uuid.UUID
) -> ids_pb2.ExecutionRef:
    """A new execution at the group's next position, admitted now; a `done` task runs again."""
    e, t = repo.executions.c, repo.tasks.c
    last = await session.scalar(sa.select(sa.func.max(e.index_in_group)).where(e.task_id == task_id))
    execution_id = new_uuid7()
    index = int(last if last is not None else -1) + 1
    await session.execute(
        sa.insert(repo.executions).values(
            execution_id=uuid.UUID(execution_id),
            task_id=task_id,
            index_in_group=index,
            state="admitted",
            replaces=replaces,
        )
    )
    await session.execute(
        sa.update(repo.tasks).where(t.task_id == task_id, t.state == "done").values(state="running")
    )
    return ids_pb2.ExecutionRef(task_id=str(task_id), execution_id=execution_id, index_in_group=index)
