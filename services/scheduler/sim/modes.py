"""The scheduling modes `gyre sim` compares: a policy, the initial roles, and the core rule (pure).

Each mode's policy and starting roles come from `policy.modes.mode_policy`, the function the
live scheduler calls too (its table lists them).

Fixed-split modes run at the workload's `async_rollout_cells` and, as `<mode>_best` in the
report, at the best split of a sweep (`best_split`); `burst_best` is the better of elastic burst
and `burst_fixed` at its best split.

Ablation variants (the paper's 12-step ablation): `async` (vanilla), `async_streaming`,
`colocate_standalone` (colocate plus A = `async_rollout_cells` standalone rollout cells that
never train), `elastic_no_streaming`, and `gyre` (the full design).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from services.scheduler.policy.modes import ModePolicy, mode_policy
from services.scheduler.policy.state import PolicyConfig
from services.scheduler.sim.engine import Simulation
from services.scheduler.sim.result import Result
from services.scheduler.sim.workload import Executions, Workload

MODES = ("colocate", "async", "async_streaming", "burst_fixed", "gyre", "burst")
FIXED_SPLIT = ("async", "async_streaming", "burst_fixed")
# What a report shows: every mode, plus each fixed-split mode at its best split (burst_best: the
# better of elastic burst and burst_fixed at its best split).
REPORTED = (*MODES, "async_best", "async_streaming_best", "burst_best")
ABLATION = ("async", "async_streaming", "colocate_standalone", "elastic_no_streaming", "gyre")


Setup = ModePolicy


def policy_config(w: Workload) -> PolicyConfig:
    return PolicyConfig(
        num_cells=w.cells,
        slots_per_cell=w.executions_per_cell,
        groups_per_step=w.groups_per_step,
        group_size=w.group_size,
        max_staleness=w.max_staleness,
        total_groups=w.total_groups,
        step_overhead_s=w.step_overhead_s,
        rollout_to_training_s=w.rollout_to_training_s,
        training_to_rollout_s=w.training_to_rollout_s,
        tokens_per_s_per_cell=w.tokens_per_s_per_cell,
    )


def setup(name: str, w: Workload, *, rollout_cells: int | None = None) -> Setup:
    """The mode's policy (`policy.modes`, the live scheduler's too) at the workload's split."""
    split = w.async_rollout_cells if rollout_cells is None else rollout_cells
    return mode_policy(name, policy_config(w), rollout_cells=split)


def simulate(
    name: str, w: Workload, x: Executions, *, rollout_cells: int | None = None, trace: bool = False
) -> Result:
    result = simulate_within(name, w, x, math.inf, rollout_cells=rollout_cells, trace=trace)
    assert result is not None
    return result


def simulate_within(
    name: str,
    w: Workload,
    x: Executions,
    past_s: float,
    *,
    rollout_cells: int | None = None,
    trace: bool = False,
) -> Result | None:
    """`simulate`, or None once the run is certain to take longer than `past_s`."""
    s = setup(name, w, rollout_cells=rollout_cells)
    sim = Simulation(w, x, s.policy, initial_training=s.initial_training, core_cell=s.core_cell, trace=trace)
    return sim.run_within(past_s)


def sweep_splits(cells: int, *, most: int = 24) -> Sequence[int]:
    """Rollout-pool sizes a sweep tries first: all of 1..cells-1, or `most` spread evenly."""
    if cells - 1 <= most:
        return range(1, cells)
    step = (cells - 2) / (most - 1)
    return sorted({1 + round(i * step) for i in range(most)})


def best_split(mode: str, w: Workload, x: Executions, *, known: Result | None = None) -> tuple[int, Result]:
    """The fixed split (rollout cells) with the shortest wall time for a fixed-split mode.

    The spread sweep is refined by trying every split between the best one's neighbours in it,
    so the best is exhaustive near the optimum. Example (32 cells): 24 splits 1, 2, 4, ..., 31;
    best 19 of neighbours 18 and 21 -> 20 is tried too. `known` is the mode's run at the
    workload's own split, if the caller has it.

    A split is simulated only until it is certain to be slower than the best so far (its run is
    then stopped, `simulate_within`): that split can be neither the best nor tied with it, so
    the answer is the one simulating every split to its end gives, at a fraction of the events.
    The workload's own split goes first and the rest nearest to it first, so the best so far is
    good early and far splits stop soon.
    """
    feasible = range(max(1, math.ceil(w.group_size / w.executions_per_cell)), w.cells)
    own = w.async_rollout_cells
    walls: dict[int, float] = {}  # every split tried; inf for one stopped as slower than the best
    results: dict[int, Result] = {}
    if known is not None and own in feasible:
        walls[own], results[own] = known.wall_s, known

    def best_so_far() -> int | None:
        return min(results, key=lambda a: (walls[a], a), default=None)

    def run(splits: Sequence[int]) -> None:
        for a in sorted(splits, key=lambda a: (abs(a - own), a)):
            if a in feasible and a not in walls:
                best = best_so_far()
                result = simulate_within(
                    mode, w, x, math.inf if best is None else walls[best], rollout_cells=a
                )
                walls[a] = math.inf if result is None else result.wall_s
                if result is not None:
                    results[a] = result

    # The workload's own split is always tried, so a mode at its best is never slower than at it.
    run(sorted({*sweep_splits(w.cells), own}))
    tried = sorted(walls)
    best = min(tried, key=lambda a: (walls[a], a))
    i = tried.index(best)
    low, high = tried[max(0, i - 1)], tried[min(len(tried) - 1, i + 1)]
    run(range(low + 1, high))
    best = min(walls, key=lambda a: (walls[a], a))
    return best, results[best]
