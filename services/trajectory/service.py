"""TrajectoryService gRPC methods (shell: validate -> load -> pure core -> encode)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy as np
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import InvalidArgument, NotFound
from gyre.ids import require_uuid
from gyre.rpc import Context
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trajectory import repo
from services.trajectory.call_log import CallLog, from_row, raw_connection
from services.trajectory.messages import record_to_proto, sample_to_proto, samples_to_packed, tree_to_proto
from services.trajectory.projection import call_tokens
from services.trajectory.records import CallRecord
from services.trajectory.replay import load_samples, load_trees
from services.trajectory.tree import validate_role_rank
from services.trajectory.weights import GRPO, MEAN_CENTERED, trajectory_id

DEFAULT_J_MAX = 5
ESTIMATORS = {
    trajectory_pb2.ADVANTAGE_ESTIMATOR_UNSPECIFIED: GRPO,
    trajectory_pb2.ADVANTAGE_ESTIMATOR_GRPO: GRPO,
    trajectory_pb2.ADVANTAGE_ESTIMATOR_MEAN_CENTERED: MEAN_CENTERED,
}


class TrajectoryServicer(trajectory_pb2_grpc.TrajectoryServiceServicer):
    def __init__(self, sessions: async_sessionmaker[AsyncSession], calls: CallLog | None = None) -> None:
        self.sessions = sessions
        self.calls = calls or CallLog()

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
                    assessable=m.assessable,
                    replaces=m.replaces,
                )
                for m in record.members
            ],
            ready=record.ready_at is not None,
            num_unassessable=sum(1 for m in record.members if m.reward is not None and not m.assessable),
            num_replacements=sum(1 for m in record.members if m.replaces),
            max_infra_retries=record.max_infra_retries,
        )
        group.registered_at.FromDatetime(record.registered_at)
        return trajectory_pb2.GetGroupResponse(group=group)

    async def GetCall(
        self, request: trajectory_pb2.GetCallRequest, context: Context
    ) -> trajectory_pb2.GetCallResponse:
        if not request.call_id:
            raise InvalidArgument("call_id", "must name a recorded call")
        async with self.sessions() as session:
            pg = await raw_connection(session)
            row = await pg.fetchrow("SELECT * FROM trajectory.calls WHERE call_id = $1", request.call_id)
            if row is None:
                raise NotFound(f"no recorded call {request.call_id}")
            (tree,) = await load_trees(session, self.calls, [row["execution_id"]])
        stored = from_row(row)
        prompt_ids, output_ids = call_tokens(tree, stored.seq)
        uniform = bool(np.all(stored.output_versions == stored.policy_version))
        record = CallRecord(
            execution_id=stored.execution_id,
            call_id=stored.call_id,
            agent_role=stored.agent_role,
            agent_id=stored.agent_id,
            prompt=prompt_ids,
            output_ids=output_ids,
            output_logprobs=stored.output_logprobs,
            policy_version=stored.policy_version,
            output_policy_versions=stored.output_versions[:0] if uniform else stored.output_versions,
            meta=stored.meta,
        )
        chain = tree.chains[tree.calls[stored.seq].chain]
        return trajectory_pb2.GetCallResponse(
            call=record_to_proto(record),
            seq=stored.seq,
            trajectory_id=trajectory_id(tree.execution_id, chain.index),
        )

    async def GetExecutionTree(
        self, request: trajectory_pb2.GetExecutionTreeRequest, context: Context
    ) -> trajectory_pb2.GetExecutionTreeResponse:
        if not request.execution_id:
            raise InvalidArgument("execution_id", "must name an execution")
        role_rank = validate_role_rank(request.role_rank)
        async with self.sessions() as session:
            (tree,) = await load_trees(session, self.calls, [request.execution_id])
        return trajectory_pb2.GetExecutionTreeResponse(
            tree=tree_to_proto(tree, j_max=request.j_max or DEFAULT_J_MAX, role_rank=role_rank)
        )

    async def StreamSamples(
        self, request: trajectory_pb2.StreamSamplesRequest, context: Context
    ) -> AsyncIterator[trajectory_pb2.StreamSamplesResponse]:
        role_rank = validate_role_rank(request.role_rank)
        estimator = ESTIMATORS.get(request.advantage_estimator)
        if estimator is None:
            raise InvalidArgument("advantage_estimator", f"unknown value {request.advantage_estimator}")
        async with self.sessions() as session:
            samples = await load_samples(
                session,
                self.calls,
                execution_ids=list(request.execution_ids),
                task_ids=list(request.task_ids),
                j_max=request.j_max or DEFAULT_J_MAX,
                role_rank=role_rank,
                estimator=estimator,
                skip_without_calls=request.skip_executions_without_calls,
            )
        if request.encoding == trajectory_pb2.SAMPLE_ENCODING_PACKED:
            for packed in samples_to_packed(samples):
                yield trajectory_pb2.StreamSamplesResponse(packed=packed)
            return
        for sample in samples:
            yield trajectory_pb2.StreamSamplesResponse(sample=sample_to_proto(sample))
