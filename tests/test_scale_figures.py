"""bench.scale's arithmetic (pure): the time-scaled workload the simulator reads, the scripted
agent's shapes, and the live-versus-simulated comparison."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.scale_figures import compare_modes, quantile, rel_err, scaled_workload, shapes
from gyre.errors import InvalidArgument

WORKLOAD: dict[str, Any] = {
    "name": "w",
    "cells": 16,
    "async_rollout_cells": 8,
    "execution": {"duration_s": {"dist": "lognormal", "median": 60, "sigma": 0.4}, "timeout_s": 600},
    "training": {"tokens_per_s_per_cell": 20000, "step_overhead_s": 10},
    "switch": {"rollout_to_training_s": 8.0, "training_to_rollout_s": 4.0},
}


def test_scaling_divides_durations_multiplies_rates_and_lets_the_profile_win() -> None:
    out = scaled_workload(
        WORKLOAD, costs={"training": {"tokens_per_s_per_cell": 24000.0}}, time_scale=20, cells=64
    )
    assert out["execution"]["duration_s"]["median"] == 3.0
    assert out["execution"]["duration_s"]["sigma"] == 0.4  # a shape, not a duration
    assert out["execution"]["timeout_s"] == 30.0
    assert out["training"]["tokens_per_s_per_cell"] == 24000.0 * 20  # the profile's, scaled
    assert out["training"]["step_overhead_s"] == 0.5
    assert out["training"]["group_setup_s"] == 0.1  # the simulator's default, scaled too
    assert out["switch"]["rollout_to_training_s"] == 0.4
    assert out["switch"]["link_bytes_per_s"] == 4.0e11 * 20
    assert (out["cells"], out["async_rollout_cells"]) == (64, 63)
    assert WORKLOAD["execution"]["duration_s"]["median"] == 60  # the input is left alone


def test_a_bad_scale_or_an_unscalable_duration_is_refused_by_name() -> None:
    with pytest.raises(InvalidArgument, match="time_scale"):
        scaled_workload(WORKLOAD, costs={}, time_scale=0)
    trace = {**WORKLOAD, "execution": {"duration_s": {"dist": "trace", "file": "x", "field": "d"}}}
    with pytest.raises(InvalidArgument, match=r"execution\.duration_s\.dist"):
        scaled_workload(trace, costs={}, time_scale=2)


def test_shapes_spend_each_duration_between_the_calls() -> None:
    got = shapes([3.0, 1.5], outputs=(16, 16, 16))
    assert [s.tool_s for s in got] == [1.5, 0.75]
    assert all(s.outputs == (16, 16, 16) for s in got)


def test_comparison_figures() -> None:
    live = {"colocate": 12.0, "async": 10.0, "gyre": 8.0, "burst": None}
    sim = {"colocate": 11.0, "async": 10.5, "gyre": 8.8, "burst": 9.0, "async_streaming": 9.5}
    out = compare_modes(live, sim)
    assert out["gyre_fastest"] is True
    assert out["best_baseline"] == "async"
    assert out["gyre_speedup_over_best_baseline"] == pytest.approx(1.25)
    assert out["max_sim_rel_err"] == pytest.approx(0.1)  # gyre: |8.8 - 8| / 8
    assert out["modes"]["async_streaming"] == {"wall_s": None, "sim_wall_s": 9.5, "rel_err": None}
    assert out["modes"]["burst"]["rel_err"] is None  # did not finish live
    slower = compare_modes({"async": 7.0, "gyre": 8.0}, sim)
    assert slower["gyre_fastest"] is False
    assert slower["gyre_speedup_over_best_baseline"] == pytest.approx(7 / 8)


def test_rel_err_and_quantile_edges() -> None:
    assert rel_err(None, 1.0) is None
    assert rel_err(1.0, math.nan) is None
    assert quantile([], 0.99) is None
    assert quantile([float(i) for i in range(1, 101)], 0.99) == 99.0
