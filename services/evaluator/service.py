"""EvaluatorService gRPC methods (shell: validate -> grade in a sandbox -> maybe publish -> answer)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay
from gyre.errors import Conflict, InvalidArgument
from gyre.evaluator.v1 import evaluator_pb2, evaluator_pb2_grpc
from gyre.ids import require_uuid
from gyre.rpc import Context
from services.evaluator import repo
from services.evaluator.config import EvaluatorSettings
from services.evaluator.consumer import store_reward
from services.evaluator.grading import Grader
from services.evaluator.rewards import grade_execution, task_for, workspace_path


class EvaluatorServicer(evaluator_pb2_grpc.EvaluatorServiceServicer):
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

    async def GradeWorkspace(
        self, request: evaluator_pb2.GradeWorkspaceRequest, context: Context
    ) -> evaluator_pb2.GradeWorkspaceResponse:
        require_uuid("execution.execution_id", request.execution.execution_id, what="an execution")

        async def grade(session: AsyncSession) -> evaluator_pb2.GradeWorkspaceResponse:
            # bad input is an error here; in grading (below and from events) it is `not assessable`
            task_for(request.task, family=request.family, tasks_dir=self.settings.tasks_dir)
            path = workspace_path(request.workspace_uri)
            if not path.is_dir():
                raise InvalidArgument("workspace_uri", f"{str(path)!r} is not a folder")
            graded = await grade_execution(
                self.grader,
                tasks_dir=self.settings.tasks_dir,
                execution_id=request.execution.execution_id,
                task_id=request.execution.task_id,
                family=request.family,
                task=request.task,
                workspace_uri=request.workspace_uri,
                partial=request.partial,
            )
            published = False
            if request.publish_reward:
                rid = request.request_id
                published = await store_reward(session, graded, request_id=rid, causation_id=rid)
                if not published:
                    raise Conflict(f"execution {graded.execution_id} already has a reward")
            return evaluator_pb2.GradeWorkspaceResponse(grade=graded, reward_published=published)

        response, fresh = await repo.requests.answer_once(
            self.sessions,
            method="GradeWorkspace",
            request=request,
            cls=evaluator_pb2.GradeWorkspaceResponse,
            act=grade,
        )
        if fresh and response.reward_published:
            self.relay.poke()
        return response
