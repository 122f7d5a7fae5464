"""SchedulerService gRPC methods (shell: decode -> validate -> persist with outbox -> answer)."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import structlog
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.outbox import enqueue
from gyre.errors import NotFound
from gyre.events import new_event
from gyre.ids import new_uuid7, require_uuid
from gyre.rpc import Context
from gyre.scheduler.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc
from services.scheduler import repo
from services.scheduler.cell_control import CellControl
from services.scheduler.codec import (
    execution_scheduled,
    runner_offer_from_proto,
    spec_from_proto,
    task_to_proto,
)
from services.scheduler.prompt_window import PromptWindow
from services.scheduler.runnable import Catalog, check_runnable
from services.scheduler.runner_offers import RunnerOffer, check_offered
from services.scheduler.task_control import cancel_task, list_executions
from services.scheduler.task_list import list_tasks
from services.scheduler.tasks import execution_limit_s, plan_tasks, validate_deadlines, validate_specs

log = structlog.get_logger(__name__)
PRODUCER = "scheduler"
OFFER_TTL_S = 120.0
"""A runner's registration counts this long (runners register every 30 s): one gone for good
stops vouching for what it could run."""


class SchedulerServicer(CellControl, scheduler_pb2_grpc.SchedulerServiceServicer):
    """Tasks here; cells and modes in `CellControl`."""

    def __init__(
        self, *args: Any, catalog: Catalog, prompt_window: PromptWindow | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.catalog = catalog
        self.prompt_window = prompt_window or PromptWindow(None)
        """What runners and evaluators can run: SubmitTasks refuses anything else up front."""
        self.offers: dict[str, tuple[RunnerOffer, float]] = {}
        """What each registered runner can run, and when it said so (monotonic): kept in memory,
        since runners register again every 30 s (a restarted scheduler hears from them soon)."""

    async def RegisterRunner(
        self, request: scheduler_pb2.RegisterRunnerRequest, context: Context
    ) -> scheduler_pb2.RegisterRunnerResponse:
        offer = runner_offer_from_proto(request)
        known = offer.runner_id in self.offers
        self.offers[offer.runner_id] = (offer, time.monotonic())
        if not known:
            log.info("runner_registered", runner_id=offer.runner_id, harnesses=sorted(offer.harnesses))
        return scheduler_pb2.RegisterRunnerResponse()

    def current_offers(self) -> list[RunnerOffer]:
        cutoff = time.monotonic() - OFFER_TTL_S
        return [offer for offer, at in self.offers.values() if at >= cutoff]

    async def SubmitTasks(
        self, request: scheduler_pb2.SubmitTasksRequest, context: Context
    ) -> scheduler_pb2.SubmitTasksResponse:
        answer, fresh = await repo.requests.answer_once(
            self.sessions,
            method="SubmitTasks",
            request=request,
            cls=scheduler_pb2.SubmitTasksResponse,
            act=lambda session: self._submit(session, request),
        )
        if fresh:
            self.relay.poke()
            self.on_change()
            log.info("tasks_submitted", request_id=request.request_id, tasks=len(answer.tasks))
        return answer

    async def _submit(
        self, session: AsyncSession, request: scheduler_pb2.SubmitTasksRequest
    ) -> scheduler_pb2.SubmitTasksResponse:
        """Validate and plan the tasks, store them and their events; the answer to SubmitTasks."""
        specs = [spec_from_proto(t) for t in request.tasks]
        validate_specs(specs)
        validate_deadlines(specs, now=datetime.now(UTC))
        check_runnable(specs, self.catalog)
        check_offered(specs, self.current_offers())
        await asyncio.to_thread(self.prompt_window.check, specs)
        planned = plan_tasks(
            specs,
            task_ids=[new_uuid7() for _ in specs],
            execution_ids=[[new_uuid7() for _ in range(s.group_size)] for s in specs],
            now=datetime.now(UTC),
        )
        state = (
            scheduler_pb2.TASK_STATE_ADMITTED
            if self.admission == "at_submit"
            else scheduler_pb2.TASK_STATE_PENDING
        )
        response = scheduler_pb2.SubmitTasksResponse(tasks=[task_to_proto(t, state=state) for t in planned])
        events = [
            new_event(
                events_pb2.TaskSubmitted(task=task, request_id=request.request_id),
                producer=PRODUCER,
                correlation_id=task.task_id,
                causation_id=request.request_id,
            )
            for task in response.tasks
        ]
        if self.admission == "at_submit":
            # One ExecutionScheduled per execution, in the same transaction: the runner starts from it.
            # Paced (the default), the driver schedules them as the policy admits each task.
            now = datetime.now(UTC)
            version = await repo.current_version(session)
            events += [
                new_event(
                    execution_scheduled(
                        task, execution, admitted_version=version, timeout_s=execution_limit_s(spec, now=now)
                    ),
                    producer=PRODUCER,
                    correlation_id=task.task_id,
                    causation_id=request.request_id,
                )
                for task, spec in zip(response.tasks, specs, strict=True)
                for execution in task.executions
            ]
        await repo.insert_tasks(session, planned, request_id=request.request_id)
        if self.admission == "at_submit":
            for t in planned:
                await repo.admit_task(session, uuid.UUID(t.task_id), version=version)
        await enqueue(session, repo.outbox, *events)
        return response

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

    async def ListExecutions(
        self, request: scheduler_pb2.ListExecutionsRequest, context: Context
    ) -> scheduler_pb2.ListExecutionsResponse:
        return await list_executions(self.sessions, request)

    async def ListTasks(
        self, request: scheduler_pb2.ListTasksRequest, context: Context
    ) -> scheduler_pb2.ListTasksResponse:
        return await list_tasks(self.sessions, request)

    async def CancelTask(
        self, request: scheduler_pb2.CancelTaskRequest, context: Context
    ) -> scheduler_pb2.CancelTaskResponse:
        async def act(session: AsyncSession) -> tuple[scheduler_pb2.CancelTaskResponse, list[Message]]:
            return await cancel_task(session, request, runner_address=self.runner_address)

        answer = await self._idempotent("CancelTask", request, scheduler_pb2.CancelTaskResponse, act)
        log.info("task_cancelled", task_id=request.task_id, stopped=answer.num_executions_stopped)
        return answer
