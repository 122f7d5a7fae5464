"""The scheduling modes `gyre sim` compares: a policy, the initial roles, and the core rule (pure).

Each mode's policy and starting roles come from `policy.modes.mode_policy`, the function the
live scheduler calls too (its table lists them).

Fixed-split modes run at the workload's `async_rollout_cells` and, as `<mode>_best` in the
report, at the best split of a sweep (`sweep.best_splits`); `burst_best` is the better of elastic burst
and `burst_fixed` at its best split.

Ablation variants (the paper's 12-step ablation): `async` (vanilla), `async_streaming`,
`colocate_standalone` (colocate plus A = `async_rollout_cells` standalone rollout cells that
never train), `elastic_no_streaming`, and `gyre` (the full design).
"""

from __future__ import annotations

import math

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
    sim = Simulation(
        w,
        x,
        s.policy,
        initial_training=s.initial_training,
        core_cell=s.core_cell,
        trace=trace,
        fixed_roles=name in FIXED_SPLIT,
    )
    return sim.run_within(past_s)
