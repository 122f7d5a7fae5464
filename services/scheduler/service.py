"""SchedulerService gRPC methods (shell: decode -> validate -> persist with outbox -> answer)."""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.db.requests import request_fingerprint
from gyre.errors import Conflict, NotFound
from gyre.events import new_event
from gyre.ids import new_uuid7, require_uuid, validate_request_id
from gyre.rpc import Context
from gyre.scheduler.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.scheduler import repo
from services.scheduler.codec import execution_scheduled, spec_from_proto, task_to_proto
from services.scheduler.runnable import Catalog, check_runnable
from services.scheduler.tasks import plan_tasks, validate_specs

log = structlog.get_logger(__name__)
PRODUCER = "scheduler"


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], relay: OutboxRelay, *, catalog: Catalog
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.catalog = catalog

    async def SubmitTasks(
        self, request: scheduler_pb2.SubmitTasksRequest, context: Context
    ) -> scheduler_pb2.SubmitTasksResponse:
        validate_request_id(request.request_id)
        fingerprint = request_fingerprint(request)
        async with self.sessions() as session:
            first = await self._first_answer(session, request.request_id, fingerprint)
        if first is not None:
            return first
        specs = [spec_from_proto(t) for t in request.tasks]
        validate_specs(specs)
        check_runnable(specs, self.catalog)
        planned = plan_tasks(
            specs,
            task_ids=[new_uuid7() for _ in specs],
            execution_ids=[[new_uuid7() for _ in range(s.group_size)] for s in specs],
            now=datetime.now(UTC),
        )
        response = scheduler_pb2.SubmitTasksResponse(tasks=[task_to_proto(t) for t in planned])
        events = [
            new_event(
                events_pb2.TaskSubmitted(task=task, request_id=request.request_id),
                producer=PRODUCER,
                correlation_id=task.task_id,
                causation_id=request.request_id,
            )
            for task in response.tasks
        ]
        # One ExecutionScheduled per execution, in the same transaction: the runner starts from it.
        events += [
            new_event(
                execution_scheduled(task, execution),
                producer=PRODUCER,
                correlation_id=task.task_id,
                causation_id=request.request_id,
            )
            for task in response.tasks
            for execution in task.executions
        ]
        async with self.sessions() as session, session.begin():
            claimed = await repo.requests.claim(
                session,
                request_id=request.request_id,
                method="SubmitTasks",
                fingerprint=fingerprint,
                response=response.SerializeToString(),
            )
            if claimed:
                await repo.insert_tasks(session, planned, request_id=request.request_id)
                await enqueue(session, repo.outbox, *events)
        if not claimed:  # a concurrent call with the same request id won the race
            async with self.sessions() as session:
                first = await self._first_answer(session, request.request_id, fingerprint)
            assert first is not None
            return first
        self.relay.poke()
        log.info("tasks_submitted", request_id=request.request_id, tasks=len(planned))
        return response

    async def _first_answer(
        self, session: AsyncSession, request_id: str, fingerprint: bytes
    ) -> scheduler_pb2.SubmitTasksResponse | None:
        row = await repo.requests.load(session, request_id)
        if row is None:
            return None
        method, stored_fingerprint, stored_response = row
        if method != "SubmitTasks" or stored_fingerprint != fingerprint:
            raise Conflict(f"request_id {request_id!r} was already used for a different request")
        return scheduler_pb2.SubmitTasksResponse.FromString(stored_response)

    async def GetTask(
        self, request: scheduler_pb2.GetTaskRequest, context: Context
    ) -> scheduler_pb2.GetTaskResponse:
        require_uuid("task_id", request.task_id, what="a task")
        async with self.sessions() as session:
            found = await repo.load_task(session, request.task_id)
        if found is None:
            raise NotFound(f"task {request.task_id} does not exist")
        planned, state = found
        state_value = scheduler_pb2.TaskState.Value(f"TASK_STATE_{state.upper()}")
        return scheduler_pb2.GetTaskResponse(task=task_to_proto(planned, state=state_value))
