"""Replay selected trajectories into loss-weighted samples, and group-relative advantages (pure).

Weights (DESIGN section 4): the loss covers policy-generated positions only; a target position
shared by several selected trajectories of an execution counts once (in the first sample, in
selection order, that contains it); token losses average within an execution and then across
the batch, so each counted target of execution `e` weighs `1 / (E * U_e)`, where `U_e` is the
number of distinct selected targets of `e` and `E` the number of executions in the batch that
have at least one (an execution with none adds nothing and does not dilute the others). The
batch loss is then the plain sum `sum(token_weight * token_loss)`; the weights sum to 1.

Advantage (`GRPO`, the default): `(r - mean_g) / (std_g + 1e-6)` over the rewards of every
assessable rewarded execution of the group (population standard deviation; the caller leaves
infrastructure failures out of `rewards`, see replay.py). It makes the advantage scale
free across tasks of different reward ranges, which suits the [0, 1] partial-credit rewards; a
group whose rewards are all equal yields 0 (no signal rather than noise). `MEAN_CENTERED` is
`r - mean_g` (Dr. GRPO), for recipes that avoid favouring low-variance groups.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from services.trajectory.layout import SelectedPath, Span, TokenBuffers
from services.trajectory.records import Float32Array, Int32Array, Int64Array
from services.trajectory.tree import ExecutionTree, select_chains

STD_EPS = 1e-6
GRPO = "grpo"
MEAN_CENTERED = "mean_centered"


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    """What is known of an execution's result."""

    reward: float | None = None
    advantage: float = 0.0
    task_id: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One selected trajectory, ready for the loss (every array has the length of token_ids)."""

    execution_id: str
    trajectory_id: str
    agent_role: str
    token_ids: Int32Array
    loss_mask: np.ndarray  # bool
    token_weight: Float32Array
    old_logprobs: Float32Array
    policy_versions: Int64Array
    reward: float
    advantage: float
    task_id: str
    has_reward: bool


def trajectory_id(execution_id: str, chain_index: int) -> str:
    return f"{execution_id}/{chain_index}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionReplay:
    """One execution's selected paths (in selection order) over its flat token buffer."""

    execution_id: str
    buffers: TokenBuffers
    paths: Sequence[SelectedPath]


def tree_replay(tree: ExecutionTree, *, j_max: int, role_rank: Sequence[str]) -> ExecutionReplay:
    """Select a folded tree's chains; the buffer is the tree's own (no copy)."""
    n = tree.n
    return ExecutionReplay(
        execution_id=tree.execution_id,
        buffers=TokenBuffers(
            tokens=tree.tokens[:n], target=tree.target[:n], logprob=tree.logprob[:n], version=tree.version[:n]
        ),
        paths=[
            SelectedPath(
                chain_index=c.index,
                agent_role=c.agent_role,
                spans=tree.path_spans(tree.calls[c.last_seq].end),
            )
            for c in select_chains(tree.chains, j_max=j_max, role_rank=role_rank)
        ],
    )


def replay_batch(
    trees: Sequence[ExecutionTree],
    *,
    j_max: int,
    role_rank: Sequence[str],
    outcomes: Mapping[str, Outcome],
) -> list[Sample]:
    """Samples for a batch of executions: selection, dedupe of shared targets, 1/(E*U_e) weights.

    Example (one execution, two selected chains sharing target 100):
        main#0 tokens [1, 100, 2, 101]   main#1 tokens [1, 100, 3, 102]
        U_e = 3 (100, 101, 102), E = 1
        main#0 loss_mask [0, 1, 0, 1] weight [0, 1/3, 0, 1/3]
        main#1 loss_mask [0, 0, 0, 1] weight [0, 0, 0, 1/3]
    """
    replays = [tree_replay(t, j_max=j_max, role_rank=role_rank) for t in trees]
    return assemble_samples(replays, outcomes=outcomes)


def _gather(arr: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    # Paths are a few hundred contiguous ranges: slicing and one concatenate copy at memory
    # speed, where a gather by position array would index every token.
    if not spans:
        return arr[:0].copy()
    return np.concatenate([arr[a:b] for a, b in spans])


def assemble_samples(replays: Sequence[ExecutionReplay], *, outcomes: Mapping[str, Outcome]) -> list[Sample]:
    """The samples of selected paths: loss mask, each shared target once, 1/(E*U_e) weights."""
    planned: list[tuple[ExecutionReplay, SelectedPath, np.ndarray]] = []
    unique_targets: dict[str, int] = {}
    for replay in replays:
        target = replay.buffers.target
        seen = np.zeros(len(target), np.bool_)
        unique = 0
        for path in replay.paths:
            parts = []
            for a, b in path.spans:
                parts.append(target[a:b] & ~seen[a:b])
                seen[a:b] = True
            counted = np.concatenate(parts) if parts else np.zeros(0, np.bool_)
            unique += int(np.count_nonzero(counted))
            planned.append((replay, path, counted))
        unique_targets[replay.execution_id] = unique
    num_executions = sum(1 for u in unique_targets.values() if u > 0)
    samples = []
    for replay, path, counted in planned:
        u = unique_targets[replay.execution_id]
        weight = np.float32(1.0 / (num_executions * u)) if u else np.float32(0.0)
        outcome = outcomes.get(replay.execution_id, Outcome())
        buf = replay.buffers
        samples.append(
            Sample(
                execution_id=replay.execution_id,
                trajectory_id=trajectory_id(replay.execution_id, path.chain_index),
                agent_role=path.agent_role,
                token_ids=_gather(buf.tokens, path.spans),
                loss_mask=counted,
                token_weight=counted.astype(np.float32) * weight,
                # Context positions hold 0 in both buffers (see TokenBuffers).
                old_logprobs=_gather(buf.logprob, path.spans),
                policy_versions=_gather(buf.version, path.spans),
                reward=outcome.reward or 0.0,
                advantage=outcome.advantage,
                task_id=outcome.task_id,
                has_reward=outcome.reward is not None,
            )
        )
    return samples


def group_advantages(rewards: Mapping[str, float], *, estimator: str = GRPO) -> dict[str, float]:
    """Advantage of every execution of one group from the group's rewards.

    Example:
        {"a": 1.0, "b": 0.0} -> GRPO {"a": 1.0, "b": -1.0} (mean 0.5, std 0.5)
    """
    if not rewards:
        return {}
    values = np.fromiter(rewards.values(), np.float64, len(rewards))
    centered = values - values.mean()
    if estimator == GRPO:
        centered = centered / (values.std() + STD_EPS)
    elif estimator != MEAN_CENTERED:
        raise ValueError(f"unknown advantage estimator {estimator!r}")
    return {e: float(a) for e, a in zip(rewards, centered, strict=True)}
