"""RunnerService gRPC methods (shell: validate -> record -> supervisor -> answer)."""

from __future__ import annotations

from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.common.v1 import ids_pb2
from gyre.db.requests import request_fingerprint
from gyre.errors import Conflict, InvalidArgument, NotFound
from gyre.ids import require_uuid, validate_request_id
from gyre.rpc import Context
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from services.runner import repo
from services.runner.codec import execution_to_proto, launch_from_request
from services.runner.config import RunnerSettings
from services.runner.executions import ENDED, grading_task, validate_launch
from services.runner.harness import HARNESSES, RESERVED_ENV
from services.runner.supervisor import Supervisor
from services.runner.workspace import check_template

log = structlog.get_logger(__name__)
MAX_REASON_CHARS = 1024


class RunnerServicer(runner_pb2_grpc.RunnerServiceServicer):
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], supervisor: Supervisor, settings: RunnerSettings
    ) -> None:
        self.sessions = sessions
        self.supervisor = supervisor
        self.settings = settings

    async def StartExecution(
        self, request: runner_pb2.StartExecutionRequest, context: Context
    ) -> runner_pb2.StartExecutionResponse:
        launch = launch_from_request(
            request,
            task=grading_task(workspace_template=request.workspace_template, labels={}, task=request.task),
        )
        validate_launch(launch, harnesses=HARNESSES, reserved_env=RESERVED_ENV)
        digest = request_fingerprint(request)
        async with self.sessions() as session:
            first = await self._first(session, request.request_id, "StartExecution", digest)
        if first is None:
            check_template(request.workspace_template, self.settings.template_sources())
            async with self.sessions() as session, session.begin():
                claimed = await repo.claim_request(
                    session,
                    request_id=launch.request_id,
                    method="StartExecution",
                    fingerprint=digest,
                    execution_id=launch.execution_id,
                )
                if claimed and not await repo.insert_execution(session, launch):
                    raise Conflict(f"execution {launch.execution_id} was already started by another request")
            if claimed:
                self.supervisor.start(launch)
                log.info("execution_accepted", execution_id=launch.execution_id, harness=launch.harness)
        await self.supervisor.wait_started(launch.execution_id)
        return runner_pb2.StartExecutionResponse(execution=await self._load(launch.execution_id))

    async def CancelExecution(
        self, request: runner_pb2.CancelExecutionRequest, context: Context
    ) -> runner_pb2.CancelExecutionResponse:
        """Stop the execution. One this runner does not know yet (its ExecutionScheduled not taken
        up) is cancelled before it starts: when it comes, it ends at once as cancelled."""
        validate_request_id(request.request_id)
        require_uuid("execution_id", request.execution_id, what="an execution")
        if len(request.reason) > MAX_REASON_CHARS:
            raise InvalidArgument("reason", f"must be at most {MAX_REASON_CHARS} characters")
        digest = request_fingerprint(request)
        async with self.sessions() as session:
            first = await self._first(session, request.request_id, "CancelExecution", digest)
        if first is None:
            async with self.sessions() as session, session.begin():
                await repo.lock_execution(session, request.execution_id)  # vs. its ExecutionScheduled
                row = await repo.load_execution(session, request.execution_id)
                await repo.claim_request(
                    session,
                    request_id=request.request_id,
                    method="CancelExecution",
                    fingerprint=digest,
                    execution_id=request.execution_id,
                )
                if row is None:
                    await repo.cancel_early(
                        session,
                        request.execution_id,
                        reason=request.reason or "cancelled",
                        request_id=request.request_id,
                    )
            if row is not None and row.state not in ENDED:
                await self.supervisor.cancel(
                    request.execution_id, reason=request.reason, request_id=request.request_id
                )
        async with self.sessions() as session:
            row = await repo.load_execution(session, request.execution_id)
        if row is None:  # cancelled before it was scheduled here
            return runner_pb2.CancelExecutionResponse(
                execution=runner_pb2.Execution(
                    execution=ids_pb2.ExecutionRef(execution_id=request.execution_id),
                    state=runner_pb2.EXECUTION_STATE_CANCELLED,
                )
            )
        return runner_pb2.CancelExecutionResponse(execution=execution_to_proto(row))

    async def GetExecution(
        self, request: runner_pb2.GetExecutionRequest, context: Context
    ) -> runner_pb2.GetExecutionResponse:
        require_uuid("execution_id", request.execution_id, what="an execution")
        return runner_pb2.GetExecutionResponse(execution=await self._load(request.execution_id))

    async def _first(self, session: AsyncSession, request_id: str, method: str, digest: bytes) -> str | None:
        row = await repo.load_request(session, request_id)
        if row is None:
            return None
        stored_method, stored_digest, execution_id = row
        if stored_method != method or stored_digest != digest:
            raise Conflict(f"request_id {request_id!r} was already used for a different request")
        return execution_id

    async def _row(self, execution_id: str) -> Any:
        async with self.sessions() as session:
            row = await repo.load_execution(session, execution_id)
        if row is None:
            raise NotFound(f"execution {execution_id} does not exist")
        return row

    async def _load(self, execution_id: str) -> runner_pb2.Execution:
        return execution_to_proto(await self._row(execution_id))
