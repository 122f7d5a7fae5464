"""Task and execution states follow the other services' events (shell: JetStream consumers + SQL).

    execution: pending -> admitted -> running -> finished | timed_out | failed | cancelled
               -> graded -> trained
               (any of these before graded) -> infra_failed   (an unassessable grade: `replacements`)
               cancelled stays cancelled when its grade comes   (cancelled alone: never replaced)
    task:      pending -> admitted -> running -> done -> graded -> trained   (or cancelled)
               done -> running   (a replacement was scheduled)
    both:      ... -> set_aside (the trainer's GroupSetAside: the group will not be trained)

`admitted` is the scheduler's own decision (`driver`); the rest comes from the runner's start and
end events, the evaluator's `RewardAssigned`, the trajectory service's `GroupReady` and the
trainer's `StepCompleted` (which also moves the cluster's version and its observed training
cost). An unassessable grade records an infrastructure failure and may schedule a replacement
execution in the same group (`replacements`; a `done` task then runs again); an `infra_failed`
execution keeps that state, so ListExecutions shows it after its group trained. Otherwise a state
only ever moves forward, so a late or repeated event changes no state (a late end event still
records the execution's length where none is recorded); each event is claimed in
the inbox in the transaction of its writes. After each commit the driver is poked.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
import structlog
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, after_commit
from gyre.db.inbox import TxHandler as InTransaction
from gyre.db.outbox import enqueue
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from services.scheduler import repo
from services.scheduler.replacements import record_unassessable

log = structlog.get_logger(__name__)
ENDED = ("finished", "timed_out", "failed", "cancelled")
BEFORE_END = ("pending", "admitted", "running")


def _uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def advance_execution(
    session: AsyncSession,
    execution_id: str,
    *,
    to: str,
    allowed_from: Sequence[str],
    duration_s: float | None = None,
) -> uuid.UUID | None:
    """Move one execution forward; its task id when it moved, None otherwise."""
    key = _uuid(execution_id)
    if key is None:
        return None
    e = repo.executions.c
    values: dict[str, object] = {"state": to}
    if duration_s is not None:
        values["duration_s"] = duration_s
    stmt = (
        sa.update(repo.executions)
        .where(e.execution_id == key, e.state.in_(allowed_from))
        .values(**values)
        .returning(e.task_id)
    )
    row = (await session.execute(stmt)).first()
    return None if row is None else row.task_id


async def _keep_duration(session: AsyncSession, execution_id: str, duration_s: float) -> None:
    """The four producers are consumed independently, so the trainer's StepCompleted may move an
    execution to `trained` before the runner's end event is read; the state then stays, but the
    length is the runner's fact (the live facts and `gyre trace export` read it) and is kept."""
    key = _uuid(execution_id)
    if key is None:
        return
    e = repo.executions.c
    await session.execute(
        sa.update(repo.executions)
        .where(e.execution_id == key, e.duration_s.is_(None))
        .values(duration_s=duration_s)
    )


async def advance_tasks(
    session: AsyncSession,
    task_ids: Sequence[uuid.UUID],
    *,
    to: str,
    allowed_from: Sequence[str],
    **values: object,
) -> int:
    t = repo.tasks.c
    stmt = (
        sa.update(repo.tasks)
        .where(t.task_id.in_(task_ids), t.state.in_(allowed_from))
        .values(state=to, **values)
    )
    result = await session.execute(stmt)
    return int(result.rowcount)  # type: ignore[attr-defined]


async def task_done_if_all_ended(session: AsyncSession, task_id: uuid.UUID) -> None:
    e = repo.executions.c
    open_left = await session.scalar(
        sa.select(sa.func.count()).where(e.task_id == task_id, e.state.in_(BEFORE_END))
    )
    if open_left == 0:
        await advance_tasks(session, [task_id], to="done", allowed_from=("admitted", "running"))


class LifecycleEvents:
    """Four durable consumers (one per producer), each handler one transaction."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        default_mode: str,
        on_change: Callable[[], None],
        on_enqueued: Callable[[], None] = lambda: None,
    ) -> None:
        self.sessions = sessions
        self.default_mode = default_mode
        self.on_change = on_change
        self.on_enqueued = on_enqueued  # wakes the outbox relay after a commit that enqueued events

    def specs(self) -> list[ConsumerSpec]:
        return [
            self._spec(
                "runner",
                {
                    runner_events.ExecutionStarted: self.on_started,
                    runner_events.ExecutionFinished: self.on_finished,
                    runner_events.ExecutionTimedOut: self.on_timed_out,
                    runner_events.ExecutionFailed: self.on_failed,
                    runner_events.ExecutionCancelled: self.on_cancelled,
                },
            ),
            self._spec("evaluator", {evaluator_events.RewardAssigned: self.on_reward}),
            self._spec("trajectory", {trajectory_events.GroupReady: self.on_group_ready}),
            self._spec(
                "trainer",
                {
                    trainer_events.StepCompleted: self.on_step_completed,
                    trainer_events.GroupSetAside: self.on_group_set_aside,
                },
            ),
        ]

    def _spec(self, producer: str, handlers: dict[type[Message], InTransaction]) -> ConsumerSpec:
        name = f"scheduler-lifecycle-{producer}"

        def changed(handler: InTransaction) -> InTransaction:
            async def run(session: AsyncSession, event: DecodedEvent) -> None:
                await handler(session, event)
                after_commit(session, self.on_change)

            return run

        inbox = Inbox(
            sessions=self.sessions,
            table=repo.processed_messages,
            handlers={cls: changed(h) for cls, h in handlers.items()},
        )
        return ConsumerSpec(durable=name, producer=producer, inbox=inbox)

    async def on_started(self, session: AsyncSession, event: DecodedEvent) -> None:
        task_id = await advance_execution(
            session, event.payload.execution.execution_id, to="running", allowed_from=("pending", "admitted")
        )
        if task_id is not None:
            await advance_tasks(session, [task_id], to="running", allowed_from=("pending", "admitted"))

    async def _ended(self, session: AsyncSession, execution_id: str, state: str, duration_s: float) -> None:
        task_id = await advance_execution(
            session, execution_id, to=state, allowed_from=BEFORE_END, duration_s=duration_s
        )
        if task_id is not None:
            await task_done_if_all_ended(session, task_id)
        else:
            await _keep_duration(session, execution_id, duration_s)

    async def on_finished(self, session: AsyncSession, event: DecodedEvent) -> None:
        p = event.payload
        await self._ended(session, p.execution.execution_id, "finished", p.duration_s)

    async def on_timed_out(self, session: AsyncSession, event: DecodedEvent) -> None:
        p = event.payload
        await self._ended(session, p.execution.execution_id, "timed_out", p.timeout_s)

    async def on_failed(self, session: AsyncSession, event: DecodedEvent) -> None:
        await self._ended(session, event.payload.execution.execution_id, "failed", 0.0)

    async def on_cancelled(self, session: AsyncSession, event: DecodedEvent) -> None:
        await self._ended(session, event.payload.execution.execution_id, "cancelled", 0.0)

    async def on_reward(self, session: AsyncSession, event: DecodedEvent) -> None:
        grade = event.payload.grade
        if not grade.assessable:
            events = await record_unassessable(session, grade, causation_id=event.event_id)
            if events:
                await enqueue(session, repo.outbox, *events)
                after_commit(session, self.on_enqueued)
                await task_done_if_all_ended(session, uuid.UUID(events[-1].correlation_id))
                return
        await advance_execution(session, grade.execution_id, to="graded", allowed_from=ENDED)

    async def on_group_ready(self, session: AsyncSession, event: DecodedEvent) -> None:
        key = _uuid(event.payload.task_id)
        if key is not None:
            await advance_tasks(session, [key], to="graded", allowed_from=("admitted", "running", "done"))

    async def on_group_set_aside(self, session: AsyncSession, event: DecodedEvent) -> None:
        """The trainer will not train this group: it leaves its step, which takes another group
        (left assigned, the step would wait for it forever)."""
        key = _uuid(event.payload.task_id)
        if key is None:
            return
        moved = await advance_tasks(
            session, [key], to="set_aside", allowed_from=("admitted", "running", "done", "graded")
        )
        if moved:
            e = repo.executions.c
            await session.execute(
                sa.update(repo.executions)
                .where(e.task_id == key, e.state.not_in(("trained", "cancelled", "infra_failed")))
                .values(state="set_aside")
            )
            log.warning("group_set_aside_observed", task_id=str(key), reason=event.payload.reason)

    async def on_step_completed(self, session: AsyncSession, event: DecodedEvent) -> None:
        p = event.payload
        keys = [k for k in (_uuid(t) for t in p.task_ids) if k is not None]
        version = int(p.version.steps)
        await advance_tasks(
            session,
            keys,
            to="trained",
            allowed_from=("admitted", "running", "done", "graded"),
            trained_version=version,
        )
        e = repo.executions.c
        await session.execute(
            sa.update(repo.executions)
            # Neither entered the loss: an infrastructure failure, an execution cancelled alone.
            .where(e.task_id.in_(keys), e.state.not_in(("infra_failed", "cancelled")))
            .values(state="trained")
        )
        c = repo.cluster.c
        await repo.load_cluster(session, default_mode=self.default_mode)  # the row exists from here on
        await session.execute(
            sa.update(repo.cluster)
            .where(c.id == 1, c.version < version)
            .values(
                version=version,
                version_at=datetime.now(UTC),
                trained_groups=c.trained_groups + len(p.task_ids),
                trained_tokens=c.trained_tokens + int(p.num_target_tokens),
                training_cell_s=c.training_cell_s + p.duration_s * max(1, p.max_dp_world_size),
            )
        )
        log.info("step_observed", version=version, groups=len(p.task_ids))
