"""The lower bound holds for every simulated mode, on the reference-like small workload and on
randomized small workloads (a property test over a few seeds), and each new term is exercised."""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from services.scheduler.sim.bound import (
    admission_bound,
    all_reduce,
    cap_admission_bound,
    first_batch_costs,
    group_costs,
    lower_bounds,
    update_gaps,
)
from services.scheduler.sim.chain_bound import fifo_chain
from services.scheduler.sim.modes import ABLATION, MODES, simulate
from services.scheduler.sim.path_bound import at_cap, fifo_paths
from services.scheduler.sim.workload import Executions, draw_executions, parse_workload

ALL_MODES = sorted(set(MODES) | set(ABLATION))


def random_workload(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    cells = rng.randint(3, 7)
    group_size = rng.randint(1, 4)
    slots = rng.randint(math.ceil(group_size / 2), 6)
    rollout_cells = rng.randint(math.ceil(group_size / slots), cells - 1)  # one group fits

    def cost(high: float) -> float:  # every cost is sometimes 0, which the engine must honour
        return 0.0 if rng.random() < 0.2 else rng.uniform(0, high)

    return {
        "name": f"random-{seed}",
        "seed": seed,
        "cells": cells,
        "steps": rng.randint(2, 6),
        "groups_per_step": rng.randint(1, 3),
        "group_size": group_size,
        "max_staleness": rng.randint(0, 2),
        "async_rollout_cells": rollout_cells,
        "execution": {
            "duration_s": {"dist": "lognormal", "median": rng.uniform(5, 300), "sigma": rng.uniform(0, 1)},
            "timeout_s": rng.uniform(100, 900),
            "tokens": {"dist": "lognormal", "median": rng.uniform(1000, 50000), "sigma": rng.uniform(0, 1)},
        },
        "rollout": {
            "executions_per_cell": slots,
            "migrate_s": cost(5),
            "kv_bytes_per_token": cost(4e5),
            "max_context_tokens": rng.randint(1000, 200_000),
        },
        "training": {
            "tokens_per_s_per_cell": rng.uniform(200, 5000),
            "step_overhead_s": cost(40),
            "microbatch_tokens": rng.choice([1024, 8192, 65536]),
            "group_setup_s": cost(4),
            "weight_bytes": cost(2e11),
        },
        "switch": {
            "rollout_to_training_s": cost(15),
            "training_to_rollout_s": cost(6),
            "link_bytes_per_s": rng.uniform(1e9, 1e11),
        },
    }


@pytest.mark.parametrize("seed", range(40))
def test_no_simulated_mode_beats_the_bound_on_random_workloads(seed: int) -> None:
    w = parse_workload(random_workload(seed), base_dir=Path("."))
    x = draw_executions(w)
    bound = max(lower_bounds(w, x).values())
    splits = {w.async_rollout_cells, 1 if w.executions_per_cell >= w.group_size else w.async_rollout_cells}
    cap = at_cap(steps=w.steps, groups_per_step=w.groups_per_step, max_staleness=w.max_staleness)
    cap_bound = cap_admission_bound(w, x)
    runs = {mode: simulate(mode, w, x) for mode in ALL_MODES}
    runs |= {f"async@{a}": simulate("async", w, x, rollout_cells=a) for a in splits}
    for mode, run in runs.items():
        assert run.wall_s >= bound * (1 - 1e-9), f"{mode}: {run.wall_s:.2f}s below the bound {bound:.2f}s"
        # The run's own admission sequence bounds it too (and the sequence obeys the cap).
        own = admission_bound(w, x, run.admitted_by_version)
        assert run.wall_s >= own * (1 - 1e-9), f"{mode} ran in {run.wall_s:.2f}s below its path {own:.2f}s"
        if run.admitted_by_version == cap:
            assert run.wall_s >= cap_bound * (1 - 1e-9), f"{mode}: {run.wall_s:.2f}s below {cap_bound:.2f}s"


def test_update_gaps_charges_training_cells_idle_through_updates() -> None:
    # 4 cells, two steps of 8 training cell-s, updates of 4 s, no rollout, first group at 10 s,
    # switch-in 8 s: w0 = 4. Work alone: (16 + 8 + 12) / 4 = 9; window alone: 10 + 8 + 16/4 = 22.
    # The schedule trades cells per step against waste: with n cells per step, (A) gives
    # (36 + 4 * (2n - 2)) / 4 and (B) 18 + 16/n; the term lies between the two separate bounds.
    term = update_gaps(
        cells=4, rollout_s=0.0, step_training_s=[8.0, 8.0], overhead_s=4.0, first_ready_s=10.0,
        rollout_to_training_s=8.0,
    )  # fmt: skip
    assert term == pytest.approx(22.0)  # (B) at n = 4 already beats (A) at any n
    # Heavy steps with plenty of rollout work: work alone is (400 + 160 + 8 + 12) / 4 = 145 (one
    # cell training each step), but one cell needs 10 + 2 * (80 + 4) = 178 s by (B). The best n
    # balances (A) = 145 + 2(n - 1) against (B) = 18 + 160/n: n = 1.255, 145.51 s.
    busy = update_gaps(
        cells=4, rollout_s=400.0, step_training_s=[80.0, 80.0], overhead_s=4.0, first_ready_s=10.0,
        rollout_to_training_s=8.0,
    )  # fmt: skip
    assert busy == pytest.approx(145.51, abs=0.01)


def test_short_math_like_workload_is_bounded_by_update_gaps() -> None:
    w = parse_workload(
        {**random_workload(0), "cells": 6, "steps": 6, "groups_per_step": 4, "group_size": 4,
         "max_staleness": 2, "async_rollout_cells": 3,
         "execution": {"duration_s": {"dist": "lognormal", "median": 30, "sigma": 0.4}, "timeout_s": 300,
                       "tokens": {"dist": "lognormal", "median": 4000, "sigma": 0.5}},
         "rollout": {"executions_per_cell": 8},
         "training": {"tokens_per_s_per_cell": 2000, "step_overhead_s": 10},
         "switch": {"rollout_to_training_s": 8.52, "training_to_rollout_s": 3.46}},
        base_dir=Path("."),
    )  # fmt: skip
    x = draw_executions(w)
    bounds = lower_bounds(w, x)
    assert bounds["update_gaps"] > bounds["work"]
    assert min(simulate(mode, w, x).wall_s for mode in ALL_MODES) >= max(bounds.values())


def _offline_min_longest_path(
    costs: list[float], steps: int, b: int, k: int, o: float, *, hops: bool
) -> float:
    """Every admission sequence, its longest path of jump and walk edges (and, with `hops`, the
    hops between them), the smallest of them."""
    n = len(costs)
    best = math.inf

    def longest(a: list[int]) -> float:
        length = [0.0] + [-math.inf] * steps
        for v in range(steps):
            batch = sorted(costs[(a[v - 1] if v else 0) : a[v]], reverse=True)
            for j in range(1, k + 2):
                if not hops and 1 < j <= k:
                    continue
                land = min(v + j, steps)
                untrained = 0 if (j == k + 1 or land == steps) else a[v + j - 1] - (v + j) * b
                kth = batch[untrained] if untrained < len(batch) else 0.0
                length[land] = max(length[land], length[v] + max((land - v) * o, o + kth))
        return length[steps]

    def admit(v: int, a: list[int]) -> None:
        nonlocal best
        if v == steps:
            best = min(best, longest(a))
            return
        low = max(a[-1] if a else 0, (v + 1) * b)
        high = n if v == steps - 1 else min((v + k + 1) * b, n)
        for end in range(low, high + 1):
            admit(v + 1, [*a, end])

    admit(0, [])
    return best


def _small_chain_case(seed: int) -> tuple[list[float], int, int, int, float]:
    rng = random.Random(seed)
    steps, b, k = rng.randint(1, 5), rng.randint(1, 3), rng.randint(0, 3)
    costs = [0.0 if rng.random() < 0.2 else rng.uniform(0, 100) for _ in range(steps * b)]
    return costs, steps, b, k, (0.0 if rng.random() < 0.2 else rng.uniform(0, 20))


@pytest.mark.parametrize("seed", range(12))
def test_fifo_paths_is_below_the_longest_path_of_every_admission_sequence(seed: int) -> None:
    costs, steps, b, k, o = _small_chain_case(seed)
    paths = fifo_paths(costs=costs, steps=steps, groups_per_step=b, max_staleness=k, overhead_s=o)
    assert paths is not None
    assert steps * o - 1e-9 <= paths <= _offline_min_longest_path(costs, steps, b, k, o, hops=True) + 1e-9


def test_fifo_paths_charges_a_hop_that_the_online_game_cannot() -> None:
    # B=1, K=2, c = [1, 5, 5], O = 1: admitting everything at version 0 leaves at most one group
    # untrained after step 1, so step 1 publishes after a 5 (hop 0 -> 2) and the run takes 7.
    # The game commits to walk or jump before a(1) is chosen and gets 6.
    args = {"costs": [1.0, 5.0, 5.0], "steps": 3, "groups_per_step": 1, "max_staleness": 2, "overhead_s": 1.0}
    assert fifo_paths(**args) == pytest.approx(7.0)
    assert fifo_chain(**args) == pytest.approx(6.0)


@pytest.mark.parametrize("seed", range(6))
def test_fifo_chain_is_the_online_game_value_below_every_admission_sequence(seed: int) -> None:
    rng = random.Random(seed)
    steps, b, k = rng.randint(1, 4), rng.randint(1, 3), rng.randint(0, 2)
    costs = [rng.uniform(0, 100) for _ in range(steps * b)]
    o = rng.uniform(0, 20)
    game = fifo_chain(costs=costs, steps=steps, groups_per_step=b, max_staleness=k, overhead_s=o)
    assert game <= _offline_min_longest_path(costs, steps, b, k, o, hops=False) + 1e-9
    assert game >= steps * o  # at least the updates


def test_fifo_chain_follows_a_heavy_batch_that_the_average_of_chains_dilutes() -> None:
    # B=1, K=1: one slow group among fast ones. Averaging two chains halves its weight; the FIFO
    # chain walks to it and jumps over it whole: 0 -> walk 1 + 1 -> 1 -> jump 100 + 1 -> 3 -> ...
    costs = [1.0, 100.0, 1.0, 1.0]
    term = fifo_chain(costs=costs, steps=4, groups_per_step=1, max_staleness=1, overhead_s=1.0)
    average = (sum(sorted(costs, reverse=True)) + 4 * 1.0) / 2
    assert term > average


def test_groups_past_the_rollout_slots_start_only_as_earlier_executions_end() -> None:
    # 2 cells of 1 slot, groups of one execution lasting 5, 1, 3, 2 s: the third starts once the
    # 1 s one ends, the fourth once the 3 s one ends (the second to end). Edges from version 0
    # see the groups ready by 5, 1, 4, 5.
    w = parse_workload(
        {**random_workload(0), "cells": 2, "steps": 4, "groups_per_step": 1, "group_size": 1,
         "max_staleness": 3, "async_rollout_cells": 1, "rollout": {"executions_per_cell": 1}},
        base_dir=Path("."),
    )  # fmt: skip
    x = Executions(duration_s=(5.0, 1.0, 3.0, 2.0), tokens=(0, 0, 0, 0), timed_out=(False,) * 4)
    assert first_batch_costs(w, x) == [5.0, 1.0, 4.0, 5.0]
    assert group_costs(w, x) == [5.0, 1.0, 3.0, 2.0]


def test_cap_admission_fixes_each_steps_groups_and_charges_their_release() -> None:
    # 2 cells, S=2, B=1, K=0, O=1; groups ready after 5 and 2 s, 3 cell-s of training each.
    # Admitting at the cap, step 0 trains group 0 (P_1 >= 5 + 3/2 + 1) and step 1 group 1,
    # admitted at P_1: P_2 >= 7.5 + 2 + 1.5 + 1 = 12.
    w = parse_workload(
        {**random_workload(0), "cells": 2, "steps": 2, "groups_per_step": 1, "group_size": 1,
         "max_staleness": 0, "async_rollout_cells": 1, "rollout": {"executions_per_cell": 1},
         "training": {"tokens_per_s_per_cell": 1000, "step_overhead_s": 1}},
        base_dir=Path("."),
    )  # fmt: skip
    x = Executions(duration_s=(5.0, 2.0), tokens=(3000, 3000), timed_out=(False, False))
    assert cap_admission_bound(w, x) == pytest.approx(12.0)


def test_all_reduce_charges_every_token_trained_beside_another_cell() -> None:
    # 2 cells, 100 tokens at 10 tokens/s, 100 cell-s of other work, first group ready + updates
    # 10 s. Training everything on one cell takes 10 + 100 / 10 = 20 s; sharing it costs 0.2
    # cell-s of all-reduce per token. Work with all-reduce on every token: (100 + 20) / 2 = 60.
    args = {"work_s": 100.0, "window_s": 10.0, "cells": 2, "tokens": 100, "tokens_per_s": 10.0}
    assert all_reduce(**args, sync_s_per_token=0.0) == pytest.approx(50.0)  # the work term
    # The schedule's best is to train every token on one cell: work 50, window 20.
    assert all_reduce(**args, sync_s_per_token=0.2) == pytest.approx(50.0)
    # With less other work the two sides cross inside [0, T]: (30 + 0.2 (100 - T1)) / 2 =
    # 10 + T1 / 10 + (100 - T1) / 20 at T1 = 66.7, so 18.33 s, above the 15 s without all-reduce.
    light = {**args, "work_s": 30.0}
    assert all_reduce(**light, sync_s_per_token=0.2) == pytest.approx(18.333, abs=1e-3)
    assert all_reduce(**light, sync_s_per_token=0.0) == pytest.approx(15.0)
