"""Protobuf <-> the trajectory core's dataclasses (shell: protobuf only, no I/O)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from datetime import UTC

import numpy as np

from gyre.errors import InvalidArgument
from gyre.proxy.v1 import proxy_pb2
from gyre.trajectory.v1 import trajectory_pb2
from services.trajectory.records import CallMeta, CallRecord, PromptDelta, validate_record
from services.trajectory.tree import ExecutionTree, select_chains
from services.trajectory.weights import Sample, trajectory_id

ROLE_NAMES = {
    proxy_pb2.AGENT_ROLE_MAIN: "main",
    proxy_pb2.AGENT_ROLE_SUB: "sub",
    proxy_pb2.AGENT_ROLE_SUMMARY: "summary",
}
ROLE_VALUES = {name: value for value, name in ROLE_NAMES.items()}
FINISH_NAMES = {
    proxy_pb2.CALL_FINISH_REASON_UNSPECIFIED: "unspecified",
    proxy_pb2.CALL_FINISH_REASON_STOP: "stop",
    proxy_pb2.CALL_FINISH_REASON_LENGTH: "length",
    proxy_pb2.CALL_FINISH_REASON_CONTEXT_LENGTH: "context_length",
    proxy_pb2.CALL_FINISH_REASON_CANCELLED: "cancelled",
}
FINISH_VALUES = {name: value for value, name in FINISH_NAMES.items()}


def record_from_proto(call: proxy_pb2.CallRecord) -> CallRecord:
    """Decode and validate a proxy CallRecord; InvalidArgument names the `call.` field."""
    role = ROLE_NAMES.get(call.agent_role)
    if role is None:
        raise InvalidArgument("call.agent_role", f"must be main, sub or summary, got {call.agent_role}")
    which = call.WhichOneof("prompt")
    prompt: np.ndarray | PromptDelta
    if which == "prompt_delta":
        d = call.prompt_delta
        prompt = PromptDelta(
            parent_call_id=d.parent_call_id,
            num_shared_tokens=d.num_shared_tokens,
            new_ids=np.array(d.new_ids, np.int32),
        )
    elif which == "full_prompt":
        prompt = np.array(call.full_prompt.prompt_ids, np.int32)
    else:
        raise InvalidArgument("call.prompt", "missing: set full_prompt or prompt_delta")
    meta = CallMeta(
        engine_id=call.engine_id,
        num_migrations=call.num_migrations,
        finish_reason=FINISH_NAMES.get(call.finish_reason, "unspecified"),
        started_at=call.started_at.ToDatetime(UTC) if call.HasField("started_at") else None,
        finished_at=call.finished_at.ToDatetime(UTC) if call.HasField("finished_at") else None,
    )
    record = CallRecord(
        execution_id=call.execution_id,
        call_id=call.call_id,
        agent_role=role,
        agent_id=call.agent_id,
        prompt=prompt,
        output_ids=np.array(call.output_ids, np.int32),
        output_logprobs=np.array(call.output_logprobs, np.float32),
        policy_version=call.policy_version.steps,
        output_policy_versions=np.array(call.output_policy_versions, np.int64),
        meta=meta,
    )
    try:
        validate_record(record)
    except InvalidArgument as exc:
        raise InvalidArgument(f"call.{exc.field}", exc.problem) from exc
    return record


def record_to_proto(r: CallRecord) -> proxy_pb2.CallRecord:
    call = proxy_pb2.CallRecord(
        execution_id=r.execution_id,
        call_id=r.call_id,
        agent_role=ROLE_VALUES[r.agent_role],
        agent_id=r.agent_id,
        output_ids=r.output_ids.tolist(),
        output_logprobs=r.output_logprobs.tolist(),
        output_policy_versions=r.output_policy_versions.tolist(),
        engine_id=r.meta.engine_id,
        num_migrations=r.meta.num_migrations,
        finish_reason=FINISH_VALUES.get(r.meta.finish_reason, proxy_pb2.CALL_FINISH_REASON_UNSPECIFIED),
    )
    call.policy_version.steps = r.policy_version
    if isinstance(r.prompt, PromptDelta):
        call.prompt_delta.parent_call_id = r.prompt.parent_call_id
        call.prompt_delta.num_shared_tokens = r.prompt.num_shared_tokens
        call.prompt_delta.new_ids.extend(r.prompt.new_ids.tolist())
    else:
        call.full_prompt.prompt_ids.extend(r.prompt.tolist())
    if r.meta.started_at is not None:
        call.started_at.FromDatetime(r.meta.started_at)
    if r.meta.finished_at is not None:
        call.finished_at.FromDatetime(r.meta.finished_at)
    return call


def sample_to_proto(s: Sample) -> trajectory_pb2.Sample:
    return trajectory_pb2.Sample(
        execution_id=s.execution_id,
        trajectory_id=s.trajectory_id,
        agent_role=s.agent_role,
        token_ids=s.token_ids.tolist(),
        loss_mask=s.loss_mask.tolist(),
        token_weight=s.token_weight.tolist(),
        old_logprobs=s.old_logprobs.tolist(),
        policy_versions=s.policy_versions.tolist(),
        reward=s.reward,
        advantage=s.advantage,
        task_id=s.task_id,
        has_reward=s.has_reward,
    )


PACKED_FORMAT_VERSION = 1
PACKED_MAX_TOKENS = 262_144
"""Tokens per `PackedSamples` message (21 bytes each): well under the 64 MiB gRPC limit."""


def samples_to_packed(
    samples: Sequence[Sample], *, max_tokens: int = PACKED_MAX_TOKENS
) -> Iterator[trajectory_pb2.PackedSamples]:
    """Whole samples grouped into `PackedSamples` (format 1) of at most `max_tokens` tokens each.

    A sample longer than `max_tokens` travels alone. The arrays are little-endian; `crc32` covers
    them in field order, so a reader can refuse a damaged payload.

    Example:
        samples of 100, 200 and 50 tokens, max_tokens=250 -> messages (100,) and (200, 50)
    """
    batch: list[Sample] = []
    tokens = 0
    for s in samples:
        if batch and tokens + len(s.token_ids) > max_tokens:
            yield _packed(batch)
            batch, tokens = [], 0
        batch.append(s)
        tokens += len(s.token_ids)
    if batch:
        yield _packed(batch)


def _packed(samples: Sequence[Sample]) -> trajectory_pb2.PackedSamples:
    arrays = [
        np.concatenate([s.token_ids for s in samples]).astype("<i4").tobytes(),
        np.concatenate([s.loss_mask for s in samples]).astype("u1").tobytes(),
        np.concatenate([s.token_weight for s in samples]).astype("<f4").tobytes(),
        np.concatenate([s.old_logprobs for s in samples]).astype("<f4").tobytes(),
        np.concatenate([s.policy_versions for s in samples]).astype("<i8").tobytes(),
    ]
    crc = 0
    for data in arrays:
        crc = zlib.crc32(data, crc)
    return trajectory_pb2.PackedSamples(
        format_version=PACKED_FORMAT_VERSION,
        execution_ids=[s.execution_id for s in samples],
        trajectory_ids=[s.trajectory_id for s in samples],
        agent_roles=[s.agent_role for s in samples],
        task_ids=[s.task_id for s in samples],
        num_tokens=[len(s.token_ids) for s in samples],
        rewards=[s.reward for s in samples],
        advantages=[s.advantage for s in samples],
        has_rewards=[s.has_reward for s in samples],
        token_ids=arrays[0],
        loss_mask=arrays[1],
        token_weight=arrays[2],
        old_logprobs=arrays[3],
        policy_versions=arrays[4],
        crc32=crc,
    )


def tree_to_proto(
    tree: ExecutionTree, *, j_max: int, role_rank: Sequence[str]
) -> trajectory_pb2.ExecutionTree:
    selected = {c.index for c in select_chains(tree.chains, j_max=j_max, role_rank=role_rank)}
    out = trajectory_pb2.ExecutionTree(
        execution_id=tree.execution_id,
        num_unique_tokens=tree.n,
        num_flat_tokens=tree.num_flat_tokens,
        num_target_tokens=tree.num_targets,
    )
    for c in tree.calls:
        out.calls.append(
            trajectory_pb2.TreeCall(
                call_id=c.call_id,
                seq=c.seq,
                agent_role=c.agent_role,
                agent_id=c.agent_id,
                num_prompt_tokens=c.prompt_len,
                num_output_tokens=c.output_len,
                num_shared_prompt_tokens=c.num_shared_prompt,
                trajectory_id=trajectory_id(tree.execution_id, c.chain),
            )
        )
    ends = [tree.calls[c.last_seq].end for c in tree.chains]
    for chain, end in zip(tree.chains, ends, strict=True):
        positions = tree.path(end)
        shared, shared_with = 0, ""
        for other, other_end in zip(tree.chains[: chain.index], ends, strict=False):
            common = common_depth(tree, end, other_end)
            if common > shared:
                shared, shared_with = common, trajectory_id(tree.execution_id, other.index)
        out.trajectories.append(
            trajectory_pb2.TrajectorySummary(
                trajectory_id=trajectory_id(tree.execution_id, chain.index),
                agent_role=chain.agent_role,
                agent_id=chain.agent_id,
                call_ids=[tree.calls[s].call_id for s in chain.call_seqs],
                num_tokens=len(positions),
                num_target_tokens=int(tree.target[positions].sum()),
                num_shared_prefix_tokens=shared,
                shared_prefix_with=shared_with,
                selected=chain.index in selected,
            )
        )
    return out


def common_depth(tree: ExecutionTree, a: int, b: int) -> int:
    """Number of leading tree positions the paths to `a` and `b` share."""
    pa, pb = tree.path(a), tree.path(b)
    n = min(len(pa), len(pb))
    differ = np.flatnonzero(pa[:n] != pb[:n])
    return int(differ[0]) if differ.size else n
