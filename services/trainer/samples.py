"""Training samples as replay yields them, their checks, and staleness admission (pure).

A `Sample` is one selected trajectory of an execution (DESIGN section 4): `token_ids` are the
chain's last prompt followed by its output, `loss_mask[t]` is true where token t was generated
by the policy, `token_weight[t]` is that token's weight in the batch loss (1/(E*U_e) on a unique
selected target, 0 on context), `old_logprobs[t]` the engine's logprob of token t, and
`policy_versions[t]` the policy version that generated it (meaningful on targets only).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass

from gyre.errors import InvalidArgument


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    execution_id: str
    trajectory_id: str
    agent_role: str
    token_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    token_weight: tuple[float, ...]
    old_logprobs: tuple[float, ...]
    policy_versions: tuple[int, ...]
    reward: float
    advantage: float

    @property
    def num_targets(self) -> int:
        return sum(self.loss_mask)

    def oldest_version(self) -> int | None:
        """Oldest policy version behind any target token; None when the sample has no target."""
        versions = [v for v, m in zip(self.policy_versions, self.loss_mask, strict=True) if m]
        return min(versions) if versions else None


def validate_sample(sample: Sample, *, field: str = "sample") -> Sample:
    """Refuse a sample whose per-token lists disagree or whose first token is a target.

    Token 0 has no context to be predicted from, so it can never be a target.
    """
    n = len(sample.token_ids)
    if n < 2:
        raise InvalidArgument(f"{field}.token_ids", f"needs at least 2 tokens, got {n}")
    for name in ("loss_mask", "token_weight", "old_logprobs", "policy_versions"):
        got = len(getattr(sample, name))
        if got != n:
            raise InvalidArgument(f"{field}.{name}", f"has {got} entries for {n} tokens")
    if sample.loss_mask[0]:
        raise InvalidArgument(f"{field}.loss_mask", "token 0 cannot be a target (nothing predicts it)")
    for t, (m, w, lp) in enumerate(
        zip(sample.loss_mask, sample.token_weight, sample.old_logprobs, strict=True)
    ):
        if not m and w != 0.0:
            raise InvalidArgument(f"{field}.token_weight", f"context token {t} has weight {w}, expected 0")
        if w < 0.0 or not math.isfinite(w):
            raise InvalidArgument(f"{field}.token_weight", f"token {t} has weight {w}, expected finite >= 0")
        if m and not (math.isfinite(lp) and lp <= 0.0):
            raise InvalidArgument(f"{field}.old_logprobs", f"target {t} has logprob {lp}, expected <= 0")
    if not (math.isfinite(sample.reward) and math.isfinite(sample.advantage)):
        raise InvalidArgument(f"{field}.advantage", "reward and advantage must be finite")
    return sample


def check_context(samples: Sequence[Sample], *, max_context_tokens: int) -> None:
    """Refuse a sample deeper than the model's context: its positions have no embedding to train.

    Example:
        a trajectory of 5000 tokens, context 4096 -> InvalidArgument naming it, 5000 and 4096
    """
    for i, s in enumerate(samples):
        if len(s.token_ids) > max_context_tokens:
            raise InvalidArgument(
                f"samples[{i}].token_ids",
                f"trajectory {s.trajectory_id} is {len(s.token_ids)} tokens deep, "
                f"past the model's context of {max_context_tokens}",
            )


class StalenessAction(enum.StrEnum):
    """What a step does with a sample older than the bound (never nothing, never silently)."""

    DROP = "drop"
    """Leave it out of the step and count it in the step's report."""
    FAIL = "fail"
    """Refuse the whole step."""


class StalenessExceeded(Exception):
    """A sample lags more than the bound and the trainer is configured to fail."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Admission:
    """Which samples a step trains on, and the staleness it saw."""

    kept: tuple[Sample, ...]
    num_dropped: int
    dropped: tuple[Sample, ...] = ()
    staleness_mean_steps: float
    """Mean over every sample with a target, dropped ones included: the lag the data arrived with."""
    staleness_max_steps: int


def staleness_steps(sample: Sample, *, trainer_version: int) -> int:
    """Trainer version at consumption minus the oldest version behind any of the sample's targets.

    Example:
        policy_versions on targets (3, 4, 4), trainer at version 5 -> 2
    """
    oldest = sample.oldest_version()
    return 0 if oldest is None else trainer_version - oldest


def admit(
    samples: Sequence[Sample], *, trainer_version: int, max_staleness_steps: int, action: StalenessAction
) -> Admission:
    """Apply the staleness bound to one step's samples.

    Example:
        staleness (0, 1, 3), bound 2, DROP -> kept the first two, num_dropped=1, mean 4/3, max 3
        same with FAIL -> StalenessExceeded naming the trajectory
    """
    lags = [staleness_steps(s, trainer_version=trainer_version) for s in samples]
    kept: list[Sample] = []
    dropped: list[Sample] = []
    for sample, lag in zip(samples, lags, strict=True):
        if lag <= max_staleness_steps:
            kept.append(sample)
        elif action is StalenessAction.DROP:
            dropped.append(sample)
        elif action is StalenessAction.FAIL:
            raise StalenessExceeded(
                f"trajectory {sample.trajectory_id} of execution {sample.execution_id} is {lag} versions "
                f"stale at version {trainer_version}, bound {max_staleness_steps}"
            )
    return Admission(
        kept=tuple(kept),
        num_dropped=len(dropped),
        dropped=tuple(dropped),
        staleness_mean_steps=sum(lags) / len(lags) if lags else 0.0,
        staleness_max_steps=max(lags, default=0),
    )
