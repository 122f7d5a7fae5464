"""RunnerService gRPC methods (shell: validate -> record -> supervisor -> answer)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.common.v1 import ids_pb2
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
M = TypeVar("M", bound=Message)


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

        async def accept(session: AsyncSession) -> runner_pb2.StartExecutionResponse:
            check_template(request.workspace_template, self.settings.template_sources())
            if not await repo.insert_execution(session, launch):
                raise Conflict(f"execution {launch.execution_id} was already started by another request")
            return _naming(launch.execution_id, runner_pb2.StartExecutionResponse)

        answer, fresh = await self._once("StartExecution", request, runner_pb2.StartExecutionResponse, accept)
        if fresh:
            self.supervisor.start(launch)
            log.info("execution_accepted", execution_id=launch.execution_id, harness=launch.harness)
        execution_id = answer.execution.execution.execution_id
        await self.supervisor.wait_started(execution_id)
        return runner_pb2.StartExecutionResponse(execution=await self._load(execution_id))

    async def CancelExecution(
        self, request: runner_pb2.CancelExecutionRequest, context: Context
    ) -> runner_pb2.CancelExecutionResponse:
        """Stop the execution. One this runner does not know yet (its ExecutionScheduled not taken
        up) is cancelled before it starts: when it comes, it ends at once as cancelled."""
        validate_request_id(request.request_id)
        require_uuid("execution_id", request.execution_id, what="an execution")
        if len(request.reason) > MAX_REASON_CHARS:
            raise InvalidArgument("reason", f"must be at most {MAX_REASON_CHARS} characters")
        row: Any = None

        async def accept(session: AsyncSession) -> runner_pb2.CancelExecutionResponse:
            nonlocal row
            await repo.lock_execution(session, request.execution_id)  # vs. its ExecutionScheduled
            row = await repo.load_execution(session, request.execution_id)
            if row is None:
                await repo.cancel_early(
                    session,
                    request.execution_id,
                    reason=request.reason or "cancelled",
                    request_id=request.request_id,
                )
            return _naming(request.execution_id, runner_pb2.CancelExecutionResponse)

        _, fresh = await self._once("CancelExecution", request, runner_pb2.CancelExecutionResponse, accept)
        if fresh and row is not None and row.state not in ENDED:
            await self.supervisor.cancel(
                request.execution_id, reason=request.reason, request_id=request.request_id
            )
        async with self.sessions() as session:
            now = await repo.load_execution(session, request.execution_id)
        if now is None:  # cancelled before it was scheduled here
            return runner_pb2.CancelExecutionResponse(
                execution=runner_pb2.Execution(
                    execution=ids_pb2.ExecutionRef(execution_id=request.execution_id),
                    state=runner_pb2.EXECUTION_STATE_CANCELLED,
                )
            )
        return runner_pb2.CancelExecutionResponse(execution=execution_to_proto(now))

    async def GetExecution(
        self, request: runner_pb2.GetExecutionRequest, context: Context
    ) -> runner_pb2.GetExecutionResponse:
        require_uuid("execution_id", request.execution_id, what="an execution")
        return runner_pb2.GetExecutionResponse(execution=await self._load(request.execution_id))

    async def _once(
        self, method: str, request: Message, cls: type[M], act: Callable[[AsyncSession], Awaitable[M]]
    ) -> tuple[M, bool]:
        return await repo.requests.answer_once(
            self.sessions, method=method, request=request, cls=cls, act=act
        )

    async def _row(self, execution_id: str) -> Any:
        async with self.sessions() as session:
            row = await repo.load_execution(session, execution_id)
        if row is None:
            raise NotFound(f"execution {execution_id} does not exist")
        return row

    async def _load(self, execution_id: str) -> runner_pb2.Execution:
        return execution_to_proto(await self._row(execution_id))


def _naming(execution_id: str, cls: type[M]) -> M:
    """The stored answer of the runner's RPCs names the execution; a repeat reports its state now."""
    answer = cls()
    answer.execution.execution.execution_id = execution_id  # type: ignore[attr-defined]
    return answer
