"""Splitting a step's samples into microbatches, and computing one microbatch's gradient.

`plan_microbatches` is pure: each execution's samples stay together (so its tree is packed once)
unless they exceed the token budget. `microbatch_gradient` runs forward and backward and returns
the flattened gradient in float64, the precision members accumulate and reduce in so that the
step gradient does not depend on who computed which microbatch.

Legend: P number of parameters, K predicted tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from transformers import PreTrainedModel

from services.trainer.loss import LossConfig, LossStats, microbatch_loss, token_targets
from services.trainer.policy import flat_logprobs, packed_logprobs
from services.trainer.samples import Sample


def plan_microbatches(samples: Sequence[Sample], *, max_tokens: int) -> list[tuple[Sample, ...]]:
    """One microbatch per execution, split when its flattened tokens exceed `max_tokens`.

    Example:
        e1: 3 samples of 100 tokens, e2: 1 of 500, max_tokens=250
        -> [(e1#1, e1#2), (e1#3,), (e2#1,)]
    """
    by_execution: dict[str, list[Sample]] = {}
    for s in samples:
        by_execution.setdefault(s.execution_id, []).append(s)
    out: list[tuple[Sample, ...]] = []
    for group in by_execution.values():
        current: list[Sample] = []
        tokens = 0
        for s in group:
            if current and tokens + len(s.token_ids) > max_tokens:
                out.append(tuple(current))
                current, tokens = [], 0
            current.append(s)
            tokens += len(s.token_ids)
        out.append(tuple(current))
    return out


def encode_microbatch(samples: Sequence[Sample]) -> bytes:
    return json.dumps([asdict(s) for s in samples]).encode()


def decode_microbatch(data: bytes) -> tuple[Sample, ...]:
    out = []
    for d in json.loads(data):
        for name in ("token_ids", "loss_mask", "token_weight", "old_logprobs", "policy_versions"):
            d[name] = tuple(d[name])
        out.append(Sample(**d))
    return tuple(out)


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
    model: PreTrainedModel, samples: Sequence[Sample], config: LossConfig, *, packed: bool = True
) -> MicrobatchResult:
    params = flat_parameters(model)
    for p in params:
        p.grad = None
    sequences = [s.token_ids for s in samples]
    logprobs_K = packed_logprobs(model, sequences) if packed else flat_logprobs(model, sequences)
    targets = token_targets(samples)
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
