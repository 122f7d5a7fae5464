"""One tracker row per training step, from what the services' events say (pure).

The row's names are the ones peers (verl, slime, prime-rl, OpenRLHF) log, so a dashboard built
for them reads Gyre's runs. Everything here is computed from public events alone:

- the trainer's `StepCompleted` (loss, staleness, dropped samples, training throughput) and the
  tasks it consumed;
- the evaluator's `RewardAssigned` of those tasks' executions (rewards, pass@k, solve rates);
- the runner's end events (how each execution ended) and the proxy's `LlmCallRecorded` (turns,
  tokens, calls that hit the context window, rollout throughput);
- the engines' `EngineWeightsUpdated` since the previous row (weight sync) and the scheduler's
  cell roles at the step (`CellRegistered` / `CellRoleChanged` / `CellLost`).

Two figures come from no event: engine KV use and the prefix hit rate are the engines' own
`GetEngineStats`, which the live tracker samples at each poll (`EngineSample`); a row made from
history alone (`gyre track`) has no samples and leaves them out. Tool-call parse errors are
counted where the tracker could decode the calls' tokens (the proxy's own parser on the decoded
output).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

HISTOGRAM_EDGES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Partial-credit histogram bins: [0, 0.2), [0.2, 0.4), ..., [0.8, 1.0), and exactly 1.0 on its own."""
SOLVED = 1.0
"""A reward this high solves the task (pass@k, solve_all...): every counted check passed."""
ENDINGS = ("done", "timeout", "turn_budget", "context", "crashed", "infrastructure", "cancelled")
"""How an execution ended: its harness declared the work done; the wall-clock deadline; the
harness's turn budget; a model call hit the context window (whatever the runner saw next); the
harness crashed; the infrastructure failed it (nothing ran, or the model was unavailable); it was
cancelled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionFacts:
    """What the events say about one execution (any part may still be missing)."""

    execution_id: str
    task_id: str
    reward: float | None = None
    assessable: bool = True
    ending: str = ""
    """One of ENDINGS; empty while no end event was seen."""
    num_turns: int = 0
    """Model calls the proxy recorded for it."""
    num_output_tokens: int = 0
    num_prompt_tokens: int = 0
    """Prompt tokens of its calls that carried a full prompt (a delta's base is not re-counted)."""
    hit_context: bool = False
    first_call_s: float | None = None
    """When its first model call started, in seconds since the epoch."""
    last_call_s: float | None = None
    """When its last model call finished, in seconds since the epoch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepFacts:
    """The trainer's `StepCompleted`, as a plain record."""

    step: int
    task_ids: tuple[str, ...]
    num_groups: int
    num_samples: int
    num_target_tokens: int
    staleness_mean: float
    staleness_max: int
    num_dropped_stale: int
    loss: float
    grad_norm: float
    duration_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSample:
    """One engine's `GetEngineStats` as the tracker sampled it; the token counters run from the
    engine's start."""

    engine_id: str
    kv_tokens_used: int
    kv_tokens_total: int
    prefill_tokens: int
    """Prompt positions the engine computed."""
    prefix_hit_tokens: int
    """Prompt positions whose KV it reused from its prefix cache."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """One step's figures: scalars by name, and the partial-credit histogram apart (sinks that
    draw histograms draw it; the others log its bins as scalars)."""

    step: int
    scalars: dict[str, float] = field(default_factory=dict)
    reward_histogram: tuple[int, ...] = ()

    def flat(self) -> dict[str, float]:
        """Scalars plus one `reward/hist_<low>_<high>` count per bin, for sinks with scalars only."""
        bins = {
            f"reward/hist_{label}": float(n)
            for label, n in zip(bin_labels(), self.reward_histogram, strict=True)
        }
        return {**self.scalars, **bins}


def bin_labels() -> list[str]:
    """Example: ['0.0_0.2', '0.2_0.4', '0.4_0.6', '0.6_0.8', '0.8_1.0', '1.0']."""
    pairs = itertools.pairwise(HISTOGRAM_EDGES)
    return [f"{low:.1f}_{high:.1f}" for low, high in pairs] + [f"{HISTOGRAM_EDGES[-1]:.1f}"]


def reward_histogram(rewards: Sequence[float]) -> tuple[int, ...]:
    """Counts per bin. Example: [0.0, 0.1, 0.5, 1.0, 1.0] -> (2, 0, 1, 0, 0, 2)."""
    counts = [0] * len(HISTOGRAM_EDGES)
    for r in rewards:
        if r >= HISTOGRAM_EDGES[-1]:
            counts[-1] += 1
            continue
        index = max(i for i, low in enumerate(HISTOGRAM_EDGES[:-1]) if r >= low) if r >= 0 else 0
        counts[index] += 1
    return tuple(counts)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    Example: n=4, c=1 -> pass@1 = 0.25, pass@4 = 1.0; n=4, c=0 -> 0.0.
    """
    if k > n or n <= 0:
        raise ValueError(f"k: 1..n ({n}), got {k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def _std(values: Sequence[float]) -> float:
    mean = _mean(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def step_row(
    step: StepFacts,
    executions: Sequence[ExecutionFacts],
    *,
    weight_sync_s: Sequence[float] = (),
    cell_roles: Mapping[str, str] | None = None,
    tool_call_parse_errors: int | None = None,
    engine_samples: Sequence[EngineSample] = (),
    engine_baseline: Mapping[str, EngineSample] | None = None,
) -> StepRow:
    """The row of `step` from its tasks' executions (those of `step.task_ids`).

    A figure whose inputs are absent is left out rather than logged as 0 (no rewarded execution:
    no reward figures; no weight load since the last row: no `perf/weight_sync_s`; calls not
    decoded: no `tool_call/parse_errors`; no engine sampled: no `engine/*`).
    """
    tasks = set(step.task_ids)
    mine = [e for e in executions if e.task_id in tasks]
    scalars: dict[str, float] = {
        "train/loss": step.loss,
        "train/grad_norm": step.grad_norm,
        "train/num_groups": float(step.num_groups),
        "train/num_samples": float(step.num_samples),
        "train/num_target_tokens": float(step.num_target_tokens),
        "train/step_s": step.duration_s,
        "staleness/mean": step.staleness_mean,
        "staleness/max": float(step.staleness_max),
        "samples/dropped_stale": float(step.num_dropped_stale),
    }
    if step.duration_s > 0:
        scalars["perf/train_tokens_per_s"] = step.num_target_tokens / step.duration_s
    scored = [e for e in mine if e.reward is not None and e.assessable]
    rewards = [e.reward for e in scored if e.reward is not None]
    histogram: tuple[int, ...] = ()
    if rewards:
        scalars |= {
            "reward/mean": _mean(rewards),
            "reward/std": _std(rewards),
            "reward/min": min(rewards),
            "reward/max": max(rewards),
        }
        histogram = reward_histogram(rewards)
        scalars |= _solve_rates(scored)
    scalars["executions/unassessable"] = float(
        sum(1 for e in mine if e.reward is not None and not e.assessable)
    )
    scalars |= _execution_shape(mine)
    if tool_call_parse_errors is not None:
        scalars["tool_call/parse_errors"] = float(tool_call_parse_errors)
    if weight_sync_s:
        scalars["perf/weight_sync_s"] = _mean(weight_sync_s)
        scalars["perf/weight_sync_max_s"] = max(weight_sync_s)
    scalars |= engine_figures(engine_samples, engine_baseline or {})
    if cell_roles:
        live = [r for r in cell_roles.values() if r != "lost"]
        for role in ("rollout", "training"):
            scalars[f"cells/{role}_share"] = sum(1 for r in live if r == role) / len(live) if live else 0.0
    return StepRow(step=step.step, scalars=scalars, reward_histogram=histogram)


def _solve_rates(scored: Sequence[ExecutionFacts]) -> dict[str, float]:
    """pass@1 and pass@k (k the smallest group) over assessable executions, and the share of groups
    solved by all, none, or some of their executions.

    Example: groups [1, 1], [0, 0], [1, 0] -> solve_all 1/3, solve_none 1/3, solve_partial 1/3.
    """
    groups: dict[str, list[float]] = {}
    for e in scored:
        groups.setdefault(e.task_id, []).append(e.reward or 0.0)
    k = min(len(g) for g in groups.values())
    solved = [sum(1 for r in g if r >= SOLVED) for g in groups.values()]
    sizes = [len(g) for g in groups.values()]
    return {
        "pass_at_1": _mean([pass_at_k(n, c, 1) for n, c in zip(sizes, solved, strict=True)]),
        "pass_at_k": _mean([pass_at_k(n, c, k) for n, c in zip(sizes, solved, strict=True)]),
        "pass_k": float(k),
        "solve_all": _mean([1.0 if c == n else 0.0 for n, c in zip(sizes, solved, strict=True)]),
        "solve_none": _mean([1.0 if c == 0 else 0.0 for c in solved]),
        "solve_partial": _mean([1.0 if 0 < c < n else 0.0 for n, c in zip(sizes, solved, strict=True)]),
    }


def _execution_shape(mine: Sequence[ExecutionFacts]) -> dict[str, float]:
    """Tokens, turns, endings (as shares of the ended executions) and rollout throughput."""
    out: dict[str, float] = {"executions/count": float(len(mine))}
    if not mine:
        return out
    out["executions/turns_mean"] = _mean([float(e.num_turns) for e in mine])
    out["executions/output_tokens_mean"] = _mean([float(e.num_output_tokens) for e in mine])
    out["executions/prompt_tokens_mean"] = _mean([float(e.num_prompt_tokens) for e in mine])
    ended = [e for e in mine if e.ending]
    for ending in ENDINGS:
        out[f"termination/{ending}"] = (
            sum(1 for e in ended if e.ending == ending) / len(ended) if ended else 0.0
        )
    starts = [e.first_call_s for e in mine if e.first_call_s is not None]
    ends = [e.last_call_s for e in mine if e.last_call_s is not None]
    if starts and ends and max(ends) > min(starts):
        out["perf/rollout_tokens_per_s"] = sum(e.num_output_tokens for e in mine) / (max(ends) - min(starts))
    return out


def engine_figures(samples: Sequence[EngineSample], baseline: Mapping[str, EngineSample]) -> dict[str, float]:
    """KV use and prefix hit rate over the samples taken since the previous row.

    `engine/kv_use` (mean) and `engine/kv_use_max`: the share of KV cache positions in use, over
    every sample of every engine. `engine/prefix_hit_rate`: prompt positions reused from the
    prefix cache over all prompt positions, from each engine's counters' growth since `baseline`
    (its last sample at the previous row). An engine absent from `baseline`, or whose counters
    went back (it restarted), counts from 0: its counters run from its start. Left out without
    samples, and the hit rate without prompt positions.

    Example: engine a at the previous row (prefill 100, hits 0), now (prefill 130, hits 90):
    hit rate 90 / (30 + 90) = 0.75.
    """
    out: dict[str, float] = {}
    shares = [s.kv_tokens_used / s.kv_tokens_total for s in samples if s.kv_tokens_total > 0]
    if shares:
        out["engine/kv_use"] = _mean(shares)
        out["engine/kv_use_max"] = max(shares)
    latest = {s.engine_id: s for s in samples}  # the last sample of each engine
    hits = prompt = 0
    for engine_id, now in latest.items():
        before = baseline.get(engine_id)
        base_prefill, base_hits = (before.prefill_tokens, before.prefix_hit_tokens) if before else (0, 0)
        if now.prefill_tokens < base_prefill or now.prefix_hit_tokens < base_hits:
            base_prefill, base_hits = 0, 0  # it restarted: its counters run from that start
        new_hits = now.prefix_hit_tokens - base_hits
        hits += new_hits
        prompt += new_hits + now.prefill_tokens - base_prefill
    if prompt > 0:
        out["engine/prefix_hit_rate"] = hits / prompt
    return out
