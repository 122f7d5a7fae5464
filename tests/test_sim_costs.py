"""The costs elasticity pays, as the engine charges them: KV moved over a shared link, the weight
broadcast of a joining satellite, group set-up and the all-reduce of every training round."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from services.scheduler.sim.modes import simulate
from services.scheduler.sim.result import SWITCHING, TRAINING
from services.scheduler.sim.workload import draw_executions, parse_workload
from tests.test_sim_engine import SMALL

# A small model and a slow link, so every cost is large enough to see.
COSTLY = {
    **SMALL,
    "rollout": {
        "executions_per_cell": 4,
        "migrate_s": 2.0,
        "kv_bytes_per_token": 2.0e5,
        "max_context_tokens": 50000,
    },
    "training": {**SMALL["training"], "weight_bytes": 4.0e10, "group_setup_s": 3.0},
    "switch": {**SMALL["switch"], "link_bytes_per_s": 1.0e10},
}


def test_a_move_pauses_for_its_kv_bytes_beyond_the_fixed_part() -> None:
    w = parse_workload(COSTLY, base_dir=Path("."))
    result = simulate("gyre", w, draw_executions(w), trace=True)
    moved = [p for p, hosts in zip(result.paused_s, result.hosting, strict=True) if len(hosts) > 1]
    assert moved and all(p > w.migrate_s for p in moved)


def test_without_kv_a_move_pauses_exactly_the_fixed_part() -> None:
    w = parse_workload(
        {**COSTLY, "rollout": {**COSTLY["rollout"], "kv_bytes_per_token": 0}}, base_dir=Path(".")
    )
    result = simulate("gyre", w, draw_executions(w), trace=True)
    for paused, hosts in zip(result.paused_s, result.hosting, strict=True):
        assert paused == pytest.approx((len(hosts) - 1) * w.migrate_s)


def test_a_satellite_switching_in_pays_the_weight_broadcast() -> None:
    w = parse_workload(COSTLY, base_dir=Path("."))
    result = simulate("gyre", w, draw_executions(w))
    switch_ins = [
        before.end_s - before.start_s
        for segments in result.timeline
        for before, after in itertools.pairwise(segments)
        if before.role == SWITCHING and after.role == TRAINING
    ]
    assert switch_ins and min(switch_ins) >= w.rollout_to_training_s + w.join_s - 1e-9


def test_every_round_pays_its_all_reduce_and_each_new_membership_its_group_set_up() -> None:
    w = parse_workload(COSTLY, base_dir=Path("."))
    x = draw_executions(w)
    result = simulate("async", w, x, trace=True)  # a fixed group: set up once
    n = w.cells - w.async_rollout_cells
    rounds = len(result.rounds)
    assert all(len(members) == n for _, _, members in result.rounds)
    assert result.sync_s == pytest.approx(n * (w.group_setup_s + rounds * w.allreduce_s(n)))
    cell_s = sum((end - start) * len(members) for start, end, members in result.rounds)
    assert cell_s == pytest.approx(sum(x.tokens) / w.tokens_per_s_per_cell + result.sync_s)
