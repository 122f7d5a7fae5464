"""Reproductions of the simulator bugs of issue 13, one behaviour per test."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from services.scheduler.policy import colocate
from services.scheduler.policy.state import ClusterView, Decision
from services.scheduler.sim.bound import lower_bound_s
from services.scheduler.sim.engine import Simulation
from services.scheduler.sim.modes import policy_config, simulate
from services.scheduler.sim.result import ROLLOUT, TRAINING, Result
from services.scheduler.sim.workload import draw_executions, parse_workload
from tests.test_sim_engine import SMALL

# Two cells, ten steps of one constant execution each: the reproduction of an update
# that ran with no cell in the training role.
TWO_CELLS: dict[str, Any] = {
    **SMALL,
    "cells": 2,
    "steps": 10,
    "groups_per_step": 1,
    "group_size": 1,
    "max_staleness": 0,
    "async_rollout_cells": 1,
    "execution": {
        "duration_s": {"dist": "const", "value": 40},
        "timeout_s": 900,
        "tokens": {"dist": "const", "value": 20000},
    },
}


def _updates_hold_a_training_cell(result: Result, overhead_s: float) -> bool:
    for end in result.step_end_s:
        start = end - overhead_s
        holders = [
            cell
            for cell, segments in enumerate(result.timeline)
            if any(s.role == TRAINING and s.start_s <= start and s.end_s >= end for s in segments)
        ]
        if not holders:
            return False
    return True


def test_colocate_never_beats_the_bound_by_updating_with_no_training_cell() -> None:
    w = parse_workload(TWO_CELLS, base_dir=Path("."))
    x = draw_executions(w)
    result = simulate("colocate", w, x, trace=True)
    assert result.shares()["idle"] >= 0
    assert result.wall_s >= lower_bound_s(w, x)
    assert _updates_hold_a_training_cell(result, w.step_overhead_s)


def test_a_policy_that_sends_every_cell_back_during_the_last_round_still_updates_on_a_cell() -> None:
    w = parse_workload(TWO_CELLS, base_dir=Path("."))
    x = draw_executions(w)
    config = policy_config(w)

    def eager(view: ClusterView) -> Decision:
        # Legal but greedy: whenever colocate has nothing to do, every training cell goes back.
        decision = colocate.decide(view, config)
        if decision.is_noop and view.training_cells > 0:
            return Decision(to_rollout=view.training_cells)
        return decision

    result = Simulation(w, x, eager, initial_training=0, core_cell=False, trace=True).run()
    assert _updates_hold_a_training_cell(result, w.step_overhead_s)
    assert result.wall_s >= lower_bound_s(w, x)


def test_step_untrained_tokens_counts_the_running_round_until_it_ends() -> None:
    w = parse_workload(TWO_CELLS, base_dir=Path("."))
    seen: list[tuple[bool, int]] = []

    def spy(view: ClusterView) -> Decision:
        seen.append((view.training_cells > 0 and not view.in_overhead, view.step_untrained_tokens))
        return colocate.decide(view, policy_config(w))

    Simulation(w, draw_executions(w), spy, initial_training=0, core_cell=False).run()
    # One group of 20,000 tokens in one round per step: while it trains, policies see it.
    assert any(training and tokens == 20000 for training, tokens in seen)


@pytest.mark.parametrize("mode", ["gyre", "burst", "elastic_no_streaming", "colocate_standalone"])
def test_zero_migration_time_does_not_end_an_execution_twice(mode: str) -> None:
    w = parse_workload({**SMALL, "rollout": {"executions_per_cell": 4, "migrate_s": 0}}, base_dir=Path("."))
    x = draw_executions(w)
    result = simulate(mode, w, x)
    assert result.steps == w.steps and result.executions == w.total_executions


def _role_counts(result: Result, role: str) -> list[int]:
    """Cells in `role` at the midpoint of every interval between two role changes."""
    cuts = sorted({s.start_s for segments in result.timeline for s in segments} | {result.wall_s})
    mids = [(a + b) / 2 for a, b in itertools.pairwise(cuts) if b > a]
    return [
        sum(1 for cell in result.timeline for s in cell if s.role == role and s.start_s <= t < s.end_s)
        for t in mids
    ]


def test_colocate_standalone_keeps_its_standalone_cells_rolling_out() -> None:
    w = parse_workload(SMALL, base_dir=Path("."))
    result = simulate("colocate_standalone", w, draw_executions(w), trace=True)
    assert min(_role_counts(result, ROLLOUT)) >= w.async_rollout_cells


def test_colocate_standalone_trains_on_the_whole_colocated_pool_with_no_core_cell() -> None:
    w = parse_workload(SMALL, base_dir=Path("."))
    result = simulate("colocate_standalone", w, draw_executions(w), trace=True)
    assert all(segments[0].role == ROLLOUT for segments in result.timeline)  # nobody holds the optimizer
    assert max(_role_counts(result, TRAINING)) == w.cells - w.async_rollout_cells
