"""Policy-gradient loss with a clipped importance ratio, weighted per token (pure, torch).

For every target token the loss is the PPO/GRPO clipped surrogate against the logprob recorded
by the engine that generated it, plus an optional KL penalty towards that behaviour policy
(the k3 estimator, non-negative and unbiased), times the token's weight. Weights already carry
the per-execution then per-batch averaging (DESIGN section 4), so the batch loss is a plain
weighted sum and the sum of microbatch losses is the batch loss whatever the split.

`LossConfig(mode="supervised")` is the supervised mode (the warm start's fine-tuning on
demonstrations): the weighted negative log-likelihood of the targets, `-sum(weight * logprob)`,
with the same weights, microbatching and data parallelism; advantages and old logprobs are unused.

Legend: K = one entry per (sample, token t >= 1) in sample order, the token predicted from t-1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.trainer.samples import Sample

POLICY_GRADIENT = "policy_gradient"
SUPERVISED = "supervised"


@dataclass(frozen=True, slots=True, kw_only=True)
class LossConfig:
    mode: str = POLICY_GRADIENT
    """`policy_gradient` (clipped surrogate, RL) or `supervised` (weighted NLL of the targets)."""
    clip_low: float = 0.2
    """The ratio is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """The ratio is clipped above at 1 + clip_high (raise it for DAPO's clip-higher)."""
    kl_coef: float = 0.0
    """Weight of the KL(behaviour || current) penalty; 0 turns it off."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenTargets:
    """Per-token inputs of the loss, aligned on K."""

    token_ids_K: torch.Tensor
    old_logprobs_K: torch.Tensor
    weight_K: torch.Tensor
    """token_weight where the token is a target, 0 elsewhere."""
    advantage_K: torch.Tensor
    num_targets: int


def token_targets(samples: Sequence[Sample]) -> TokenTargets:
    """Gather the loss inputs of tokens 1..T-1 of every sample, in sample order.

    Example:
        one sample, token_ids (1, 2, 100, 101), loss_mask (F, F, T, T), weight (0, 0, .5, .5),
        advantage 1.0 -> token_ids_K (2, 100, 101), weight_K (0, .5, .5), advantage_K (1, 1, 1)
    """
    ids: list[int] = []
    old: list[float] = []
    weight: list[float] = []
    adv: list[float] = []
    for s in samples:
        ids.extend(s.token_ids[1:])
        old.extend(s.old_logprobs[1:])
        weight.extend(w if m else 0.0 for w, m in zip(s.token_weight[1:], s.loss_mask[1:], strict=True))
        adv.extend([s.advantage] * (len(s.token_ids) - 1))
    return TokenTargets(
        token_ids_K=torch.tensor(ids, dtype=torch.long),
        old_logprobs_K=torch.tensor(old, dtype=torch.float32),
        weight_K=torch.tensor(weight, dtype=torch.float32),
        advantage_K=torch.tensor(adv, dtype=torch.float32),
        num_targets=sum(s.num_targets for s in samples),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LossStats:
    loss: float
    clip_fraction: float
    """Share of target tokens (by count) whose ratio was clipped."""
    kl: float
    """Weighted mean of the k3 KL estimate over targets."""


def policy_loss(
    logprobs_K: torch.Tensor, targets: TokenTargets, config: LossConfig
) -> tuple[torch.Tensor, LossStats]:
    """The weighted clipped surrogate (plus KL) of one microbatch; differentiable in logprobs_K."""
    old_K = targets.old_logprobs_K.to(logprobs_K.dtype)
    weight_K = targets.weight_K.to(logprobs_K.dtype)
    adv_K = targets.advantage_K.to(logprobs_K.dtype)
    log_ratio_K = logprobs_K - old_K
    ratio_K = torch.exp(log_ratio_K)
    clipped_K = torch.clamp(ratio_K, 1.0 - config.clip_low, 1.0 + config.clip_high)
    surrogate_K = -torch.minimum(ratio_K * adv_K, clipped_K * adv_K)
    per_token_K = surrogate_K
    kl_K = torch.exp(-log_ratio_K) + log_ratio_K - 1.0
    if config.kl_coef:
        per_token_K = per_token_K + config.kl_coef * kl_K
    loss = (weight_K * per_token_K).sum()
    with torch.no_grad():
        is_target_K = weight_K > 0
        n = int(is_target_K.sum())
        clipped = ((ratio_K != clipped_K) & is_target_K).sum().item()
        total_weight = float(weight_K.sum())
        kl = float((weight_K * kl_K).sum()) / total_weight if total_weight > 0 else 0.0
    return loss, LossStats(loss=float(loss.detach()), clip_fraction=clipped / n if n else 0.0, kl=kl)


def supervised_loss(logprobs_K: torch.Tensor, targets: TokenTargets) -> tuple[torch.Tensor, LossStats]:
    """Weighted negative log-likelihood of the targets of one microbatch.

    Example:
        logprobs_K (-0.5, -2.0), weight_K (0, 1) -> loss 2.0
    """
    weight_K = targets.weight_K.to(logprobs_K.dtype)
    loss = -(weight_K * logprobs_K).sum()
    return loss, LossStats(loss=float(loss.detach()), clip_fraction=0.0, kl=0.0)


def microbatch_loss(
    logprobs_K: torch.Tensor, targets: TokenTargets, config: LossConfig
) -> tuple[torch.Tensor, LossStats]:
    """The loss `config.mode` names."""
    if config.mode == SUPERVISED:
        return supervised_loss(logprobs_K, targets)
    if config.mode != POLICY_GRADIENT:
        raise ValueError(f"unknown loss mode {config.mode!r}: expected {POLICY_GRADIENT} or {SUPERVISED}")
    return policy_loss(logprobs_K, targets, config)
