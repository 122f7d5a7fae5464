"""`GroupReady` from the trajectory service: queue the group for a step; `StepAssigned` from the
scheduler: which queued groups form which step; `TaskCancelled`: a group never to train (shell).

Each fetched batch is queued in one transaction with the inbox records (`gyre.db.inbox`), acked
after the commit; then the step loop wakes.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import Inbox, after_commit
from gyre.events import DecodedEvent
from gyre.ids import require_uuid
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from services.trainer import repo

log = structlog.get_logger(__name__)
GROUPS_CONSUMER = "trainer-groups"


class GroupEvents:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], *, on_queued: Callable[[], None]) -> None:
        self.sessions = sessions
        self.on_queued = on_queued

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=GROUPS_CONSUMER,
            producer="trajectory",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers={trajectory_events.GroupReady: self.on_group_ready},
            ),
        )

    async def on_group_ready(self, session: AsyncSession, event: DecodedEvent) -> None:
        ready = event.payload
        require_uuid("task_id", ready.task_id, what="a task")
        await repo.enqueue_group(session, task_id=ready.task_id, execution_ids=list(ready.execution_ids))
        log.info("group_queued", task_id=ready.task_id, group_size=len(ready.execution_ids))
        after_commit(session, self.on_queued)


ASSIGNMENTS_CONSUMER = "trainer-assignments"


class AssignmentEvents:
    """`StepAssigned` from the scheduler: which groups form which step (the policy's order)."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], *, on_assigned: Callable[[], None]
    ) -> None:
        self.sessions = sessions
        self.on_assigned = on_assigned

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=ASSIGNMENTS_CONSUMER,
            producer="scheduler",
            inbox=Inbox(
                sessions=self.sessions,
                table=repo.processed_messages,
                handlers={
                    scheduler_events.StepAssigned: self.on_step_assigned,
                    scheduler_events.TaskCancelled: self.on_task_cancelled,
                },
            ),
        )

    async def on_step_assigned(self, session: AsyncSession, event: DecodedEvent) -> None:
        assigned = event.payload
        for i, task_id in enumerate(assigned.task_ids):
            require_uuid(f"task_ids[{i}]", task_id, what="a task")
        await repo.record_assignment(session, step=int(assigned.step), task_ids=list(assigned.task_ids))
        log.info("step_assigned", step=assigned.step, task_ids=list(assigned.task_ids))
        after_commit(session, self.on_assigned)

    async def on_task_cancelled(self, session: AsyncSession, event: DecodedEvent) -> None:
        """A cancelled task's group is never trained: queued, it is set aside; still to come, it is
        refused on arrival. Its step gets another group from the scheduler."""
        task_id = require_uuid("task_id", event.payload.task_id, what="a task")
        withdrawn = await repo.withdraw(session, task_id)
        log.info("group_withdrawn", task_id=task_id, withdrawn=withdrawn, reason=event.payload.reason)
        after_commit(session, self.on_assigned)
