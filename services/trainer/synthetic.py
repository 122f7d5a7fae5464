"""Synthetic executions shaped like agent trees, for benchmarks and tests (pure).

`synthetic_executions`: each execution has a shared stem (a system prompt and early turns) and
several trajectories that fork from it (retries, sub-agents), so its flattened tokens are a
multiple of its unique tokens. Context ids are below 100 and policy ids from 100 up, as in the
trajectory tests. Weights follow DESIGN section 4: 1/(E*U_e) on each unique target, a shared
target counted once (on the first trajectory through it). `synthetic_agent_tree`: one long
execution with a main chain, context compactions, sub-agents and retried calls, for tree-packing
tests and benchmarks.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from services.trainer.packing import pack_sequences
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


@dataclass(slots=True)
class _Seq:
    role: str
    ids: list[int]
    generated: list[bool]
    kind: str = ""
    """main, summary, sub or retry (a failed attempt of a main call): names the trajectory."""

    def extended(self, ids: Sequence[int], *, generated: bool, kind: str = "") -> _Seq:
        return _Seq(
            self.role, [*self.ids, *ids], [*self.generated, *([generated] * len(ids))], kind or self.kind
        )


def synthetic_agent_tree(
    *,
    seed: int,
    num_tokens: int,
    context_tokens: int,
    vocab_size: int,
    execution_id: str = "exec-0",
    num_executions: int = 1,
    advantage: float = 1.0,
) -> list[Sample]:
    """One execution shaped like an hour-long agent run: about `num_tokens` unique tree tokens.

    A main agent alternates observations (context) and outputs (policy); when its context would
    pass `context_tokens` a summary call compacts it (the summary trajectory shares the whole
    context; the next main trajectory restarts from the system prompt and the summary, pasted as
    context); now and then a call is retried (the failed attempt is its own trajectory, forking
    at the output) or a sub-agent runs from the system prompt and a task. No trajectory is deeper
    than `context_tokens`. Weights: 1/(num_executions * U) on each unique target, counted on the
    first trajectory through it.

    Example:
        num_tokens=4000, context_tokens=1024 -> about 4000 packed nodes in a dozen trajectories
        (main#1..#k, summaries, sub-agents, failed attempts), several times that flattened
    """
    rng = random.Random(seed)

    def ctx(lo: int, hi: int) -> list[int]:
        return [rng.randrange(1, 100) for _ in range(rng.randint(lo, hi))]

    def pol(lo: int, hi: int) -> list[int]:
        return [rng.randrange(100, vocab_size) for _ in range(rng.randint(lo, hi))]

    system = ctx(48, 48)
    done: list[_Seq] = []
    main = _Seq("main", list(system), [False] * len(system), "main")
    unique = len(system)
    reserve = 160  # room left for the compaction call's instruction and summary
    if context_tokens < len(system) + reserve + 192:
        raise ValueError(f"context_tokens={context_tokens} leaves no room for an agent turn")
    while unique < num_tokens:
        obs, out = ctx(16, 96), pol(16, 64)
        if len(main.ids) + len(obs) + len(out) > context_tokens - reserve:
            instr, summary = ctx(16, 16), pol(64, 128)
            compaction = main.extended(instr, generated=False).extended(summary, generated=True)
            compaction.role = compaction.kind = "summary"
            done.append(compaction)
            done.append(main)
            main = _Seq("main", [*system, *summary], [False] * (len(system) + len(summary)), "main")
            unique += len(instr) + 2 * len(summary)
            continue
        roll = rng.random()
        if roll < 0.08:  # a retried call: the failed attempt forks at the output
            done.append(
                main.extended(obs, generated=False).extended(pol(16, 64), generated=True, kind="retry")
            )
            unique += len(done[-1].ids) - len(main.ids) - len(obs)
        elif roll < 0.18:  # a sub-agent from the system prompt and a task
            sub = _Seq("sub", list(system), [False] * len(system), "sub").extended(
                ctx(32, 32), generated=False
            )
            for _ in range(rng.randint(2, 6)):
                sub_obs, sub_out = ctx(16, 64), pol(16, 48)
                if len(sub.ids) + len(sub_obs) + len(sub_out) > context_tokens:
                    break
                sub = sub.extended(sub_obs, generated=False).extended(sub_out, generated=True)
            done.append(sub)
            unique += len(sub.ids) - len(system)
        main = main.extended(obs, generated=False).extended(out, generated=True)
        unique += len(obs) + len(out)
    done.append(main)
    return _tree_samples(done, execution_id=execution_id, num_executions=num_executions, advantage=advantage)


def _tree_samples(
    seqs: Sequence[_Seq], *, execution_id: str, num_executions: int, advantage: float
) -> list[Sample]:
    """Samples with DESIGN section 4 weights: a target node shared by trajectories counts once."""
    tree = pack_sequences([s.ids for s in seqs])
    generated = [False] * tree.num_nodes
    for s, path in zip(seqs, tree.node_of, strict=True):
        for t, node in enumerate(path):
            generated[node] = generated[node] or (t > 0 and s.generated[t])
    weight = 1.0 / (num_executions * max(1, sum(generated)))
    counted: set[int] = set()
    out = []
    for j, (s, path) in enumerate(zip(seqs, tree.node_of, strict=True)):
        mask = tuple(t > 0 and generated[node] for t, node in enumerate(path))
        weights = []
        for node, m in zip(path, mask, strict=True):
            weights.append(weight if m and node not in counted else 0.0)
            if m:
                counted.add(node)
        out.append(
            Sample(
                execution_id=execution_id,
                trajectory_id=f"{execution_id}/{s.kind}-{j}",
                agent_role=s.role,
                token_ids=tuple(s.ids),
                loss_mask=mask,
                token_weight=tuple(weights),
                old_logprobs=tuple(-1.0 if m else 0.0 for m in mask),
                policy_versions=(0,) * len(s.ids),
                reward=advantage,
                advantage=advantage,
            )
        )
    return out
