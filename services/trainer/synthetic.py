"""Synthetic executions shaped like agent trees, for benchmarks and tests (pure).

Each execution has a shared stem (a system prompt and early turns) and several trajectories
that fork from it (retries, sub-agents), so its flattened tokens are a multiple of its unique
tokens. Context ids are below 100 and policy ids from 100 up, as in the trajectory tests.
Weights follow DESIGN section 4: 1/(E*U_e) on each unique target, a shared target counted once
(on the first trajectory through it).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.trainer.samples import Sample


def synthetic_executions(
    *,
    seed: int,
    num_executions: int,
    trajectories_per_execution: int,
    stem_tokens: int,
    branch_tokens: int,
    vocab_size: int,
    policy_version: int = 0,
    rewards: Sequence[float] | None = None,
) -> list[Sample]:
    """Samples of `num_executions` executions; advantages are rewards minus the group mean.

    Example:
        stem_tokens=8, branch_tokens=4, 3 trajectories -> each sample has 12 tokens,
        36 flattened for 8 + 3*4 = 20 unique
    """
    rng = random.Random(seed)
    rewards = list(rewards) if rewards is not None else [float(i % 2) for i in range(num_executions)]
    mean = sum(rewards) / len(rewards)
    out: list[Sample] = []
    for e in range(num_executions):
        stem = [_token(rng, t, vocab_size) for t in range(stem_tokens)]
        branches = [
            [_token(rng, stem_tokens + t, vocab_size, policy=t >= 2) for t in range(branch_tokens)]
            for _ in range(trajectories_per_execution)
        ]
        unique_targets = sum(1 for t in stem if t >= 100) + sum(1 for b in branches for t in b if t >= 100)
        weight = 1.0 / (num_executions * unique_targets)
        for j, branch in enumerate(branches):
            ids = stem + branch
            mask = [i > 0 and t >= 100 for i, t in enumerate(ids)]
            counted = [m and (j == 0 or i >= stem_tokens) for i, m in enumerate(mask)]
            out.append(
                Sample(
                    execution_id=f"exec-{e}",
                    trajectory_id=f"exec-{e}/traj-{j}",
                    agent_role="main" if j == 0 else "sub",
                    token_ids=tuple(ids),
                    loss_mask=tuple(mask),
                    token_weight=tuple(weight if c else 0.0 for c in counted),
                    old_logprobs=tuple(-1.0 if m else 0.0 for m in mask),
                    policy_versions=tuple(policy_version for _ in ids),
                    reward=rewards[e],
                    advantage=rewards[e] - mean,
                )
            )
    return out


def _token(rng: random.Random, position: int, vocab_size: int, *, policy: bool | None = None) -> int:
    """Context (< 100) for prompts, policy (>= 100) for generated turns; every 16-token turn alternates."""
    generated = policy if policy is not None else (position // 16) % 2 == 1
    return rng.randrange(100, vocab_size) if generated else rng.randrange(1, 100)
