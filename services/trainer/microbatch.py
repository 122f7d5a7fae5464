"""Splitting a step's samples into microbatches, and computing one microbatch's gradient.

`plan_microbatches` is pure: each execution's samples stay together (so its tree is packed once)
unless its packed tokens exceed the budget. `microbatch_gradient` runs forward and backward and returns
the flattened gradient in float64, the precision members accumulate and reduce in so that the
step gradient does not depend on who computed which microbatch.

Legend: P number of parameters, K predicted tokens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from google.protobuf.message import DecodeError
from transformers import PreTrainedModel

from gyre.errors import InvalidArgument
from gyre.trajectory.v1 import trajectory_pb2
from services.trainer.device import DevicePlan, autocast
from services.trainer.loss import LossConfig, LossStats, microbatch_loss, token_targets
from services.trainer.policy import flat_logprobs, packed_logprobs
from services.trainer.sample_arrays import PackedSamplesInvalid, decode_samples, encode_samples
from services.trainer.samples import Sample


class MicrobatchTooLarge(InvalidArgument):
    """A single trajectory needs more packed tokens than this trainer can hold in a microbatch."""


def oversized_trajectories(samples: Sequence[Sample], *, max_sample_tokens: int) -> dict[str, str]:
    """The executions with a trajectory no microbatch of this trainer can hold, each with why.

    A group holding one can never be trained by this configuration: the trainer sets it aside
    with the reason instead of postponing its step forever.

    Example:
        e1: 3 samples of 100 tokens, e2: 1 of 70000, max_sample_tokens=65536
        -> {"e2": "trajectory t7 has 70000 tokens, more than the 65536 ..."}
    """
    out: dict[str, str] = {}
    for s in samples:
        if len(s.token_ids) > max_sample_tokens and s.execution_id not in out:
            out[s.execution_id] = (
                f"trajectory {s.trajectory_id} has {len(s.token_ids)} tokens, more than the "
                f"{max_sample_tokens} one microbatch of this trainer may hold "
                "(GYRE_TRAINER_TRAJECTORY_MAX_TOKENS, or the model's context)"
            )
    return out


def plan_microbatches(
    samples: Sequence[Sample], *, max_tokens: int, max_sample_tokens: int | None = None
) -> list[tuple[Sample, ...]]:
    """One microbatch per execution, split when its packed (unique) tokens would exceed `max_tokens`.

    Samples of one execution share prefixes, so a microbatch costs the nodes of its packed tree,
    not its flattened tokens. A sample that alone needs more than `max_tokens` cannot be split
    (its tokens attend to each other): it trains in a microbatch of its own, since tree
    attention's memory is linear in the nodes, up to `max_sample_tokens` (what the trainer can
    hold; default `max_tokens`). Past that MicrobatchTooLarge names it and the sizes (the
    trainer's loop sets such a group aside before it gets here: `oversized_trajectories`).

    Example:
        e1: 3 samples of 100 tokens sharing 60, e2: 1 of 500, max_tokens=200
        -> e1#1 (100) + e1#2 (40 new) + e1#3 (40 new) = 180: [(e1#1, e1#2, e1#3)];
           with max_sample_tokens=1000: then [(e2#1,)] alone;
           without: e2#1 needs 500 > 200: MicrobatchTooLarge
    """
    limit = max_tokens if max_sample_tokens is None else max(max_tokens, max_sample_tokens)
    by_execution: dict[str, list[Sample]] = {}
    for s in samples:
        by_execution.setdefault(s.execution_id, []).append(s)
    out: list[tuple[Sample, ...]] = []
    for group in by_execution.values():
        current: list[Sample] = []
        nodes: dict[tuple[int, int], int] = {}  # the current microbatch's packed tree
        for s in group:
            if len(s.token_ids) > limit:
                raise MicrobatchTooLarge(
                    "microbatch_max_tokens",
                    f"trajectory {s.trajectory_id} has {len(s.token_ids)} tokens, more than the "
                    f"{limit} a microbatch may hold; raise the budget or shorten the context",
                )
            if len(s.token_ids) > max_tokens:
                if current:
                    out.append(tuple(current))
                    current, nodes = [], {}
                out.append((s,))
                continue
            new = len(s.token_ids) - _shared_prefix(nodes, s.token_ids)
            if current and len(nodes) + new > max_tokens:
                out.append(tuple(current))
                current, nodes = [], {}
            _insert(nodes, s.token_ids)
            current.append(s)
        if current:
            out.append(tuple(current))
    return out


def _insert(nodes: dict[tuple[int, int], int], token_ids: Sequence[int]) -> None:
    """Add a sequence to a trie of (parent node, token) -> node, nodes numbered as they come."""
    at = -1
    for token in token_ids:
        at = nodes.setdefault((at, token), len(nodes))


def _shared_prefix(nodes: dict[tuple[int, int], int], token_ids: Sequence[int]) -> int:
    at = -1
    for t, token in enumerate(token_ids):
        node = nodes.get((at, token))
        if node is None:
            return t
        at = node
    return len(token_ids)


def encode_microbatch(samples: Sequence[Sample]) -> bytes:
    """A microbatch as it travels to satellites: a serialised `PackedSamples` (arrays, checksum)."""
    return encode_samples(samples).SerializeToString()


def decode_microbatch(data: bytes) -> tuple[Sample, ...]:
    """Inverse of `encode_microbatch`; PackedSamplesInvalid when the payload is damaged."""
    packed = trajectory_pb2.PackedSamples()
    try:
        packed.ParseFromString(data)
    except DecodeError as exc:
        raise PackedSamplesInvalid("microbatch", f"is not a PackedSamples message: {exc}") from exc
    return decode_samples(packed, field="microbatch")


def flat_parameters(model: PreTrainedModel) -> list[torch.nn.Parameter]:
    """Trainable parameters in a fixed order every member agrees on."""
    return [p for _, p in sorted(model.named_parameters()) if p.requires_grad]


@dataclass(frozen=True, slots=True, kw_only=True)
class MicrobatchResult:
    grad_P: torch.Tensor
    """float64 gradient of the microbatch's weighted loss."""
    stats: LossStats
    num_targets: int


def microbatch_gradient(
    model: PreTrainedModel,
    samples: Sequence[Sample],
    config: LossConfig,
    *,
    packed: bool = True,
    autocast_bf16: bool = False,
) -> MicrobatchResult:
    """Forward and backward of one microbatch on the model's device; the loss is taken in float32."""
    params = flat_parameters(model)
    for p in params:
        p.grad = None
    sequences = [s.token_ids for s in samples]
    with autocast(DevicePlan(device=str(model.device), autocast_bf16=autocast_bf16)):
        logprobs_K = packed_logprobs(model, sequences) if packed else flat_logprobs(model, sequences)
    targets = token_targets(samples)
    if logprobs_K.device != targets.weight_K.device:
        targets = dataclasses.replace(
            targets,
            token_ids_K=targets.token_ids_K.to(logprobs_K.device),
            old_logprobs_K=targets.old_logprobs_K.to(logprobs_K.device),
            weight_K=targets.weight_K.to(logprobs_K.device),
            advantage_K=targets.advantage_K.to(logprobs_K.device),
        )
    loss, stats = microbatch_loss(logprobs_K, targets, config)
    loss.backward()  # type: ignore[no-untyped-call]
    grad_P = torch.cat(
        [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).double() for p in params]
    )
    for p in params:
        p.grad = None
    return MicrobatchResult(grad_P=grad_P, stats=stats, num_targets=targets.num_targets)


def parameters_vector(model: PreTrainedModel) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in flat_parameters(model)])


def load_parameters_vector(model: PreTrainedModel, flat_P: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for p in flat_parameters(model):
            n = p.numel()
            p.copy_(flat_P[offset : offset + n].view_as(p))
            offset += n
