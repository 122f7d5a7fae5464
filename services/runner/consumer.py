"""ExecutionScheduled from the scheduler starts an execution (shell: inbox + supervisor).

The execution's row commits with the event's inbox record; the harness starts after that commit.
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, after_commit
from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import InvalidArgument
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent, new_event
from gyre.ids import require_uuid
from gyre.runner.v1 import events_pb2, runner_pb2
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from services.runner import repo
from services.runner.codec import execution_ref, launch_from_scheduled
from services.runner.executions import Launch, validate_launch
from services.runner.harness import HARNESSES, RESERVED_ENV
from services.runner.supervisor import PRODUCER, Supervisor

log = structlog.get_logger(__name__)
SCHEDULED_CONSUMER = "runner-scheduled"
GRADED_CONSUMER = "runner-graded"


class ScheduledEvents:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], relay: OutboxRelay, supervisor: Supervisor
    ):
        self.sessions = sessions
        self.relay = relay
        self.supervisor = supervisor

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=SCHEDULED_CONSUMER,
            producer="scheduler",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers={scheduler_events.ExecutionScheduled: self.on_execution_scheduled},
            ),
        )

    async def on_execution_scheduled(self, session: AsyncSession, event: DecodedEvent) -> None:
        p: scheduler_events.ExecutionScheduled = event.payload
        require_uuid("execution.task_id", p.execution.task_id, what="a task")
        require_uuid("execution.execution_id", p.execution.execution_id, what="an execution")
        launch = launch_from_scheduled(event.event_id, p)
        problem = ""
        try:
            validate_launch(launch, harnesses=HARNESSES, reserved_env=RESERVED_ENV)
        except InvalidArgument as exc:  # the execution ends as failed, so its group still completes
            problem = str(exc)
        await repo.lock_execution(session, launch.execution_id)  # vs. a CancelExecution before it
        if not await repo.insert_execution(session, launch):
            log.info("execution_already_known", execution_id=launch.execution_id)
            return
        early = await repo.cancelled_before_start(session, launch.execution_id)
        if early is not None:
            await self._cancel_now(session, launch, reason=early[0], request_id=early[1])
            after_commit(session, self.relay.poke)
            log.info("scheduled_execution_cancelled_before_start", execution_id=launch.execution_id)
            return
        if problem:
            await self._fail_now(session, launch, problem, event.event_id)
            after_commit(session, self.relay.poke)
            log.warning("scheduled_execution_refused", execution_id=launch.execution_id, problem=problem)
            return
        after_commit(session, lambda: self.supervisor.start(launch))

    async def _cancel_now(
        self, session: AsyncSession, launch: Launch, *, reason: str, request_id: str
    ) -> None:
        """It was cancelled before it came: it ends cancelled without starting (no workspace, no call)."""
        await repo.update_execution(
            session, launch.execution_id, state="cancelled", ended_at=datetime.now(UTC)
        )
        cancelled = events_pb2.ExecutionCancelled(
            execution=execution_ref(launch),
            reason=reason,
            request_id=request_id,
            family=launch.family,
            task=launch.task,
            num_calls_recorded=0,
        )
        await enqueue(
            session,
            repo.outbox,
            new_event(cancelled, producer=PRODUCER, correlation_id=launch.task_id, causation_id=request_id),
        )

    async def _fail_now(self, session: AsyncSession, launch: Launch, problem: str, causation: str) -> None:
        kind = "harness_launch" if problem.startswith("harness") else "workspace"
        # The row says what its ExecutionFailed says: `gyre replay --service runner` rebuilds it.
        reason = f"bad scheduled execution: {problem}"
        await repo.update_execution(
            session,
            launch.execution_id,
            state="failed",
            ended_at=datetime.now(UTC),
            failure_kind=kind,
            failure_reason=reason,
        )
        failed = events_pb2.ExecutionFailed(
            execution=execution_ref(launch),
            failure=runner_pb2.ExecutionFailure(
                kind=runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_LAUNCH
                if kind == "harness_launch"
                else runner_pb2.EXECUTION_FAILURE_KIND_WORKSPACE,
                reason=reason,
            ),
            family=launch.family,
            task=launch.task,
        )
        await enqueue(
            session,
            repo.outbox,
            new_event(failed, producer=PRODUCER, correlation_id=launch.task_id, causation_id=causation),
        )


class GradedEvents:
    """RewardAssigned from the evaluator: the workspace is graded, its sandbox can go."""

    def __init__(self, supervisor: Supervisor):
        self.supervisor = supervisor

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=GRADED_CONSUMER,
            producer="evaluator",
            handlers={evaluator_events.RewardAssigned: self.on_reward_assigned},
        )

    async def on_reward_assigned(self, event: DecodedEvent) -> None:
        p: evaluator_events.RewardAssigned = event.payload
        if p.grade.execution_id in self.supervisor.ended:  # a repeat, or another runner's: nothing
            await self.supervisor.release(p.grade.execution_id)
            log.info("sandbox_released_after_grade", execution_id=p.grade.execution_id)
