"""Samples of ready groups, replayed by the trajectory service over `StreamSamples` (shell).

The trainer asks for the packed form (`SAMPLE_ENCODING_PACKED`: arrays, versioned, checksummed)
and decodes every message before it returns: a damaged or unknown payload raises
PackedSamplesInvalid for the whole fetch, so no step starts on part of its groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from gyre.errors import Unavailable
from gyre.rpc import MAX_MESSAGE_BYTES
from gyre.rpc_telemetry import channel as traced_channel
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trainer.sample_arrays import PackedSamplesInvalid, decode_samples
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


def samples_from_response(r: trajectory_pb2.StreamSamplesResponse, *, index: int) -> tuple[Sample, ...]:
    """The samples of one response, in either encoding; `index` is the first one's place in the stream."""
    which = r.WhichOneof("payload")
    if which == "packed":
        return decode_samples(r.packed, field=f"responses[samples {index}..].packed")
    if which == "sample":
        return (sample_from_proto(r.sample),)
    raise PackedSamplesInvalid(f"responses[samples {index}..]", "carries neither a sample nor packed samples")


class TrajectorySamples:
    """Streams the samples of whole groups; weights are computed over exactly these groups."""

    def __init__(self, address: str, *, j_max: int, timeout_s: float = 120.0) -> None:
        self.channel = traced_channel(
            address,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.stub = trajectory_pb2_grpc.TrajectoryServiceStub(self.channel)
        self.j_max = j_max
        self.timeout_s = timeout_s

    def request_for(self, task_ids: Sequence[str]) -> trajectory_pb2.StreamSamplesRequest:
        """The exact request `fetch` sends; the step records it so its batch can be re-derived."""
        return trajectory_pb2.StreamSamplesRequest(
            task_ids=list(task_ids), j_max=self.j_max, encoding=trajectory_pb2.SAMPLE_ENCODING_PACKED
        )

    async def fetch(self, task_ids: Sequence[str]) -> list[Sample]:
        """Every sample of the groups; their executions without calls made none and yield nothing."""
        request = self.request_for(task_ids)
        samples: list[Sample] = []
        try:
            async for r in self.stub.StreamSamples(request, timeout=self.timeout_s):
                samples.extend(samples_from_response(r, index=len(samples)))
            return samples
        except grpc.aio.AioRpcError as exc:
            raise Unavailable(f"trajectory StreamSamples failed: {exc.code().name}: {exc.details()}") from exc

    async def close(self) -> None:
        await self.channel.close(None)
