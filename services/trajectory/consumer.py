"""Events the trajectory service applies, each in the transaction that records it in the inbox (shell).

The kernel consumer (`gyre.db.inbox`) claims each event and runs these handlers in the fetched
batch's transaction; the ack follows the commit.

- `TaskSubmitted` (scheduler): learn a task's group and its allowance of infrastructure retries.
- `ExecutionReplacementDecided` (scheduler): an unassessable member's replacement (a new member
  of the group, waited for like the others) or the word that none comes. One flagged `lost` (the
  scheduler's watchdog ended it: no runner reported its end) is also recorded not assessable
  here, since no grade will come for it.
- `RewardAssigned` (evaluator): store the execution's reward and the number of calls the proxy
  recorded for it; when every execution of the group has its reward and that many calls stored,
  mark the group ready and publish `GroupReady` through the outbox (the last call stored can be
  what completes it: `CallEvents` runs the same check). A grade with `assessable = false` (an
  infrastructure failure: nothing could be judged, e.g. the sandbox or grader crashed, the
  workspace is gone) completes its execution for readiness once the scheduler's decision about
  a replacement is known, or at once when the task allows no (more) retries (a group that waited
  for nothing would never train), but is no reward: it is listed in `GroupReady`'s
  `unassessable_execution_ids`, and replay keeps it out of the group's advantage baseline and
  out of the loss. An execution
  that never gets a reward holds its group back; the runner's timeout (graded as earned) ends
  that, or, where no runner reports an end, the scheduler's watchdog (`lost`, above).
- `LlmCallRecorded` (proxy): see `CallEvents`, batched.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, NotYet, after_commit
from gyre.db.outbox import enqueue
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent, new_event
from gyre.ids import require_uuid
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from services.trajectory import repo

log = structlog.get_logger(__name__)
TASKS_CONSUMER = "trajectory-tasks"
REWARDS_CONSUMER = "trajectory-rewards"


async def publish_if_ready(session: AsyncSession, task_id: str, *, causation_id: str) -> bool:
    members = await repo.mark_ready_if_complete(session, task_id)
    if members is None:
        return False
    unassessable = await repo.unassessable_executions(session, members)
    event = new_event(
        trajectory_events.GroupReady(
            task_id=task_id,
            execution_ids=members,
            unassessable_execution_ids=[e for e in members if e in unassessable],
        ),
        producer="trajectory",
        correlation_id=task_id,
        causation_id=causation_id,
    )
    await enqueue(session, repo.outbox, event)
    log.info(
        "group_ready",
        task_id=task_id,
        group_size=len(members),
        unassessable=len(unassessable),
        replacements=await repo.count_replacements(session, task_id),
    )
    return True


class TaskEvents:
    """Learns task groups from the scheduler, so rewards can later complete them."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], poke: Callable[[], None] = lambda: None
    ) -> None:
        self.sessions = sessions
        self.poke = poke  # wakes the outbox relay after a commit that enqueued GroupReady

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=TASKS_CONSUMER,
            producer="scheduler",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers={
                    scheduler_events.TaskSubmitted: self.on_task_submitted,
                    scheduler_events.ExecutionReplacementDecided: self.on_replacement_decided,
                },
            ),
            ack_wait_s=15.0,  # bounds how long a crash delays what was fetched and not acked
        )

    async def on_task_submitted(self, session: AsyncSession, event: DecodedEvent) -> None:
        task = event.payload.task
        require_uuid("task.task_id", task.task_id, what="a task")
        for e in task.executions:
            require_uuid("task.executions.execution_id", e.execution_id, what="an execution")
        await repo.register_group(
            session,
            task_id=task.task_id,
            family=task.spec.family,
            members=[(e.execution_id, e.index_in_group) for e in task.executions],
            # The scheduler stores the allowance it used; a task submitted before the field existed
            # was accepted under the old rule: no retries.
            max_infra_retries=task.spec.max_infra_retries if task.spec.HasField("max_infra_retries") else 0,
        )
        # Rewards may have arrived first (streams are not ordered with each other).
        if await publish_if_ready(session, task.task_id, causation_id=event.event_id):
            after_commit(session, self.poke)
        log.info("group_registered", task_id=task.task_id, group_size=len(task.executions))

    async def on_replacement_decided(self, session: AsyncSession, event: DecodedEvent) -> None:
        p: scheduler_events.ExecutionReplacementDecided = event.payload
        task_id = require_uuid("execution.task_id", p.execution.task_id, what="a task")
        require_uuid("execution.execution_id", p.execution.execution_id, what="an execution")
        replacement = None
        if p.HasField("replacement"):
            require_uuid("replacement.execution_id", p.replacement.execution_id, what="an execution")
            replacement = (p.replacement.execution_id, p.replacement.index_in_group)
        known = await repo.record_replacement_decision(
            session, task_id=task_id, execution_id=p.execution.execution_id, replacement=replacement
        )
        if not known:  # its TaskSubmitted is still on the way (a redelivery overtook it)
            raise NotYet(f"group {task_id} is not known yet")
        if p.lost:
            # The scheduler ended it (no runner reported an end): no grade will come, so it is
            # not assessable now; a late grade loses to this one (the first reward wins).
            await repo.record_reward(
                session,
                execution_id=p.execution.execution_id,
                task_id=task_id,
                reward=0.0,
                assessable=False,
                partial=False,
            )
        if await publish_if_ready(session, task_id, causation_id=event.event_id):
            after_commit(session, self.poke)
        log.info(
            "replacement_decided",
            task_id=task_id,
            execution_id=p.execution.execution_id,
            replacement=replacement[0] if replacement else "",
        )


class RewardEvents:
    """Stores rewards and completes groups."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], poke: Callable[[], None] = lambda: None
    ) -> None:
        self.sessions = sessions
        self.poke = poke  # wakes the outbox relay after a commit that enqueued GroupReady

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=REWARDS_CONSUMER,
            producer="evaluator",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers={evaluator_events.RewardAssigned: self.on_reward_assigned},
            ),
            ack_wait_s=15.0,  # bounds how long a crash delays what was fetched and not acked
        )

    async def on_reward_assigned(self, session: AsyncSession, event: DecodedEvent) -> None:
        grade = event.payload.grade
        require_uuid("grade.execution_id", grade.execution_id, what="an execution")
        require_uuid("grade.task_id", grade.task_id, what="a task")
        fresh = await repo.record_reward(
            session,
            execution_id=grade.execution_id,
            task_id=grade.task_id,
            reward=grade.score if grade.assessable else 0.0,
            assessable=grade.assessable,
            partial=grade.partial,
            num_calls_expected=(
                event.payload.num_calls_recorded if event.payload.HasField("num_calls_recorded") else None
            ),
        )
        if not fresh:
            log.warning("reward_already_assigned", execution_id=grade.execution_id)
        if await publish_if_ready(session, grade.task_id, causation_id=event.event_id):
            after_commit(session, self.poke)
