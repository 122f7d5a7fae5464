"""Events the trajectory service applies: decode, apply in one transaction, ack after commit (shell)."""

from __future__ import annotations

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.consume import ConsumerSpec
from gyre.db.inbox import claim_event
from gyre.events import DecodedEvent
from gyre.ids import require_uuid
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from services.trajectory import repo

log = structlog.get_logger(__name__)
TASKS_CONSUMER = "trajectory-tasks"


class TaskEvents:
    """Learns task groups from the scheduler, so rewards can later complete them."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable=TASKS_CONSUMER,
            producer="scheduler",
            handlers={scheduler_events.TaskSubmitted: self.on_task_submitted},
        )

    async def on_task_submitted(self, event: DecodedEvent) -> None:
        task = event.payload.task
        require_uuid("task.task_id", task.task_id, what="a task")
        for e in task.executions:
            require_uuid("task.executions.execution_id", e.execution_id, what="an execution")
        async with self.sessions() as session, session.begin():
            if not await claim_event(
                session, repo.processed_messages, consumer=TASKS_CONSUMER, event_id=event.event_id
            ):
                log.info("event_already_processed")
                return
            await repo.register_group(
                session,
                task_id=task.task_id,
                family=task.spec.family,
                members=[(e.execution_id, e.index_in_group) for e in task.executions],
            )
        log.info("group_registered", task_id=task.task_id, group_size=len(task.executions))
