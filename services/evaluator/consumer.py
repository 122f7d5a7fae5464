"""Runner end events become rewards: grade (or record not assessable), then publish (shell)."""

from __future__ import annotations

from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, after_commit
from gyre.db.outbox import OutboxRelay, enqueue
from gyre.evaluator.v1 import evaluator_pb2, events_pb2
from gyre.events import DecodedEvent, new_event
from gyre.ids import require_uuid
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2
from services.evaluator import repo
from services.evaluator.config import EvaluatorSettings
from services.evaluator.grading import Grader
from services.evaluator.rewards import grade_execution, grade_message
from services.evaluator.scoring import not_assessable

log = structlog.get_logger(__name__)
RUNNER_CONSUMER = "evaluator-runner"
PRODUCER = "evaluator"


class RunnerEvents:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        grader: Grader,
        settings: EvaluatorSettings,
    ):
        self.sessions = sessions
        self.relay = relay
        self.grader = grader
        self.settings = settings

    def spec(self) -> ConsumerSpec:
        ended = (
            runner_events.ExecutionFinished,
            runner_events.ExecutionTimedOut,
            runner_events.ExecutionFailed,
            runner_events.ExecutionCancelled,
        )
        return ConsumerSpec(
            durable=RUNNER_CONSUMER,
            producer="runner",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers=dict.fromkeys(ended, self.on_ended),
            ),
            # Grading runs under the handler (a test suite may take minutes); it reports progress,
            # so an evaluator killed mid-grading has the event redelivered after ack_wait_s.
            ack_wait_s=30.0,
            progress_every_s=10.0,
            batch=1,
        )

    async def on_ended(self, session: AsyncSession, event: DecodedEvent) -> None:
        """Grade in the transaction that records the event (one at a time: `batch=1`)."""
        p: Any = event.payload
        execution_id = require_uuid("execution.execution_id", p.execution.execution_id, what="an execution")
        task_id = p.execution.task_id
        # Only a harness that ran and crashed left work of the policy's behind; a sandbox that
        # never started, a harness that never launched or a runner that lost it left the template
        # as it was, and grading that would score the task, not the policy.
        crashed_with_workspace = (
            isinstance(p, runner_events.ExecutionFailed)
            and p.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED
            and bool(p.workspace_uri)
        )
        if crashed_with_workspace or isinstance(
            p, (runner_events.ExecutionFinished, runner_events.ExecutionTimedOut)
        ):
            # A crashed harness still left work behind: it earns partial credit like a timeout;
            # an empty or missing workspace is `not assessable`.
            grade = await grade_execution(
                self.grader,
                tasks_dir=self.settings.tasks_dir,
                execution_id=execution_id,
                task_id=task_id,
                family=p.family,
                task=p.task,
                workspace_uri=p.workspace_uri,
                partial=not isinstance(p, runner_events.ExecutionFinished),
            )
        else:
            why = (
                f"the execution failed ({p.failure.reason})"
                if isinstance(p, runner_events.ExecutionFailed)
                else f"the execution was cancelled ({p.reason})"
            )
            grade = grade_message(
                execution_id=execution_id,
                task_id=task_id,
                scored=not_assessable(why),
                partial=False,
                grader=f"{p.family or 'unknown'}@0",
                duration_s=0.0,
            )
            # The scheduler tells a cancel from an infrastructure failure by this flag, not by
            # its own state: its runner and evaluator consumers are not ordered with each other.
            grade.cancelled = isinstance(p, runner_events.ExecutionCancelled)
        await store_reward(
            session,
            grade,
            request_id="",
            causation_id=event.event_id,
            # Passed on so the trajectory service waits for exactly these calls (DESIGN section 3).
            num_calls_recorded=p.num_calls_recorded if p.HasField("num_calls_recorded") else None,
        )
        after_commit(session, self.relay.poke)
        log.info("reward_assigned", execution_id=execution_id, score=grade.score, assessable=grade.assessable)


async def store_reward(
    session: AsyncSession,
    grade: evaluator_pb2.Grade,
    *,
    request_id: str,
    causation_id: str,
    num_calls_recorded: int | None = None,
) -> bool:
    """Store the reward and enqueue RewardAssigned (in the caller's transaction); False if it was
    rewarded before."""
    envelope = new_event(
        events_pb2.RewardAssigned(grade=grade, request_id=request_id, num_calls_recorded=num_calls_recorded),
        producer=PRODUCER,
        correlation_id=grade.task_id,
        causation_id=causation_id,
    )
    inserted = await repo.insert_reward(
        session,
        execution_id=grade.execution_id,
        task_id=grade.task_id,
        score=grade.score,
        assessable=grade.assessable,
        grade=grade.SerializeToString(),
    )
    if inserted:
        await enqueue(session, repo.outbox, envelope)
    return inserted
