"""TrajectoryService gRPC methods (shell: validate -> load -> encode)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import NotFound
from gyre.ids import require_uuid
from gyre.rpc import Context
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trajectory import repo


class TrajectoryServicer(trajectory_pb2_grpc.TrajectoryServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def GetGroup(
        self, request: trajectory_pb2.GetGroupRequest, context: Context
    ) -> trajectory_pb2.GetGroupResponse:
        require_uuid("task_id", request.task_id, what="a task")
        async with self.sessions() as session:
            record = await repo.load_group(session, request.task_id)
        if record is None:
            raise NotFound(f"no group for task {request.task_id} (not submitted, or not yet consumed)")
        group = trajectory_pb2.Group(
            task_id=record.task_id,
            family=record.family,
            group_size=record.group_size,
            executions=[
                trajectory_pb2.GroupExecution(
                    execution_id=m.execution_id,
                    index_in_group=m.index_in_group,
                    has_reward=m.reward is not None,
                    reward=m.reward or 0.0,
                )
                for m in record.members
            ],
            ready=all(m.reward is not None for m in record.members),
        )
        group.registered_at.FromDatetime(record.registered_at)
        return trajectory_pb2.GetGroupResponse(group=group)
