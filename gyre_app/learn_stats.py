"""The learning run's figures: means with bootstrap intervals, paired gains, zero-advantage groups (pure).

A score here is one instance's rewards, sampled several times at a fixed policy version. The
interval resamples *instances* (with replacement), each instance's mean over its samples kept
whole: the instances are what a user means by "the task set", and a gain paired by instance
(the same instance and sample seeds for both policies) cancels how hard each instance is.
The resampling draws from a `random.Random(seed)`, so the same figures give the same interval.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Interval:
    mean: float
    low: float
    high: float
    level: float
    num_instances: int

    def as_dict(self, name: str) -> dict[str, float]:
        return {
            name: round(self.mean, 4),
            f"{name}_ci_low": round(self.low, 4),
            f"{name}_ci_high": round(self.high, 4),
        }


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy's default).

    Example: _quantile([0.0, 1.0, 2.0, 3.0], 0.5) -> 1.5
    """
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_mean(
    per_instance: Sequence[float], *, seed: int, level: float = 0.9, resamples: int = 2000
) -> Interval:
    """The mean of `per_instance` with a percentile bootstrap interval at `level` (two-sided).

    Example: bootstrap_mean([0.5, 0.5, 0.5], seed=0) -> Interval(mean=0.5, low=0.5, high=0.5, ...)
    """
    if not per_instance:
        raise ValueError("bootstrap_mean: no instances to take the mean of")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_mean: level must be in (0, 1), got {level}")
    if resamples < 1:
        raise ValueError(f"bootstrap_mean: resamples must be >= 1, got {resamples}")
    values = list(per_instance)
    n = len(values)
    rng = random.Random(seed)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return Interval(
        mean=sum(values) / n,
        low=_quantile(means, tail),
        high=_quantile(means, 1.0 - tail),
        level=level,
        num_instances=n,
    )


def instance_means(samples: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """Each instance's mean over its samples.

    Example: {"a": [1.0, 0.5], "b": [0.0]} -> {"a": 0.75, "b": 0.0}
    """
    bad = sorted(name for name, s in samples.items() if not s)
    if bad:
        raise ValueError(f"instances without a sample: {', '.join(bad)}")
    return {name: sum(s) / len(s) for name, s in samples.items()}


def paired_differences(
    after: Mapping[str, Sequence[float]], before: Mapping[str, Sequence[float]]
) -> list[float]:
    """Per instance, mean(after) - mean(before), over the same instances in both (sorted by name).

    Example: after {"a": [1.0], "b": [0.5]}, before {"a": [0.5], "b": [0.5]} -> [0.5, 0.0]
    """
    if set(after) != set(before):
        only = sorted(set(after) ^ set(before))
        raise ValueError(
            f"a paired gain needs the same instances on both sides; unmatched: {', '.join(only)}"
        )
    a, b = instance_means(after), instance_means(before)
    return [a[name] - b[name] for name in sorted(a)]


def pooled(*runs: Mapping[str, Sequence[float]]) -> dict[str, list[float]]:
    """Several runs' samples as one set of instances, each keyed by its run's position.

    Example: pooled({"a": [1.0]}, {"a": [0.0]}) -> {"0/a": [1.0], "1/a": [0.0]}
    """
    return {f"{i}/{name}": list(s) for i, run in enumerate(runs) for name, s in run.items()}


def zero_advantage_share(groups: Sequence[Sequence[float]]) -> float:
    """Share of groups whose rewards are all equal: their group-relative advantages are all zero,
    so they teach nothing. Groups with fewer than two rewards count as zero-advantage too.

    Example: [[0.5, 0.5, 0.5], [0.0, 1.0, 0.5], [1.0]] -> 0.6667 (two of three)
    """
    if not groups:
        raise ValueError("zero_advantage_share: no groups")
    flat = sum(1 for g in groups if len(g) < 2 or max(g) - min(g) < 1e-9)
    return flat / len(groups)
