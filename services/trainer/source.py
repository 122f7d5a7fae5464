"""Samples of ready groups, replayed by the trajectory service over `StreamSamples` (shell)."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from gyre.errors import Unavailable
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trainer.samples import Sample


def sample_from_proto(s: trajectory_pb2.Sample) -> Sample:
    return Sample(
        execution_id=s.execution_id,
        trajectory_id=s.trajectory_id,
        agent_role=s.agent_role,
        token_ids=tuple(s.token_ids),
        loss_mask=tuple(s.loss_mask),
        token_weight=tuple(s.token_weight),
        old_logprobs=tuple(s.old_logprobs),
        policy_versions=tuple(int(v) for v in s.policy_versions),
        reward=s.reward,
        advantage=s.advantage,
    )


class TrajectorySamples:
    """Streams the samples of whole groups; weights are computed over exactly these groups."""

    def __init__(self, address: str, *, j_max: int, timeout_s: float = 120.0) -> None:
        self.channel = grpc.aio.insecure_channel(address)
        self.stub = trajectory_pb2_grpc.TrajectoryServiceStub(self.channel)
        self.j_max = j_max
        self.timeout_s = timeout_s

    async def fetch(self, task_ids: Sequence[str]) -> list[Sample]:
        """Every sample of the groups; their executions without calls made none and yield nothing."""
        request = trajectory_pb2.StreamSamplesRequest(task_ids=list(task_ids), j_max=self.j_max)
        try:
            return [
                sample_from_proto(r.sample)
                async for r in self.stub.StreamSamples(request, timeout=self.timeout_s)
            ]
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"trajectory StreamSamples failed: {exc.code().name}: {exc.details()}") from exc

    async def close(self) -> None:
        await self.channel.close(None)
