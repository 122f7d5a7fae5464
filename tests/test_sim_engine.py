"""Invariants of the discrete-event simulator, for every mode, on a small seeded workload."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from services.scheduler.sim.bound import lower_bound_s
from services.scheduler.sim.modes import ABLATION, MODES, REPORTED, simulate
from services.scheduler.sim.result import ROLLOUT, TRAINING, Result
from services.scheduler.sim.workload import Executions, Workload, draw_executions, parse_workload

SMALL: dict[str, Any] = {
    "name": "small",
    "seed": 7,
    "cells": 6,
    "steps": 5,
    "groups_per_step": 3,
    "group_size": 4,
    "max_staleness": 1,
    "async_rollout_cells": 3,
    "execution": {
        "duration_s": {"dist": "lognormal", "median": 300, "sigma": 0.8},
        "timeout_s": 900,
        "tokens": {"dist": "lognormal", "median": 40000, "sigma": 0.5},
    },
    "rollout": {"executions_per_cell": 4, "migrate_s": 2.0},
    "training": {"tokens_per_s_per_cell": 1000, "step_overhead_s": 20, "microbatch_tokens": 8192},
    "switch": {"rollout_to_training_s": 8.52, "training_to_rollout_s": 3.46},
}
ALL_MODES = sorted(set(MODES) | set(ABLATION))


@pytest.fixture(scope="module")
def small() -> tuple[Workload, Executions]:
    w = parse_workload(SMALL, base_dir=Path("."))
    return w, draw_executions(w)


@pytest.fixture(scope="module")
def runs(small: tuple[Workload, Executions]) -> dict[str, Result]:
    w, x = small
    return {mode: simulate(mode, w, x, trace=True) for mode in ALL_MODES}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_no_cell_is_in_two_roles_at_once(runs: dict[str, Result], mode: str) -> None:
    result = runs[mode]
    for segments in result.timeline:
        assert segments[0].start_s == 0.0 and segments[-1].end_s == result.wall_s
        for before, after in itertools.pairwise(segments):
            assert before.end_s == after.start_s  # contiguous, never overlapping

    def role_at(cell: int, start: float, end: float) -> set[str]:
        return {s.role for s in result.timeline[cell] if s.start_s < end and s.end_s > start}

    for intervals in result.hosting:  # every execution ran only on cells in the rollout role
        for cell, start, end in intervals:
            if end > start:
                assert role_at(cell, start, end) == {ROLLOUT}
    for start, end, members in result.rounds:  # every microbatch round ran only on training cells
        for cell in members:
            assert role_at(cell, start, end) == {TRAINING}


@pytest.mark.parametrize("mode", ALL_MODES)
def test_no_rollout_cell_serves_more_than_its_slots(
    runs: dict[str, Result], small: tuple[Workload, Executions], mode: str
) -> None:
    w, _ = small
    changes: dict[int, list[tuple[float, int]]] = {}
    for intervals in runs[mode].hosting:
        for cell, start, end in intervals:
            changes.setdefault(cell, []).extend([(start, 1), (end, -1)])
    for events in changes.values():
        load = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # ends before starts at a tie
            load += delta
            assert load <= w.executions_per_cell


@pytest.mark.parametrize("mode", ALL_MODES)
def test_every_execution_is_run_and_trained_exactly_once(
    runs: dict[str, Result], small: tuple[Workload, Executions], mode: str
) -> None:
    w, x = small
    result = runs[mode]
    assert result.steps == w.steps
    assert result.executions == w.total_executions
    assert len(result.staleness) == w.total_groups  # each group consumed once
    assert result.trained_tokens == sum(x.tokens)
    for e, intervals in enumerate(result.hosting):
        ran = sum(end - start for _, start, end in intervals)
        moves = len(intervals) - 1
        assert result.paused_s[e] >= moves * w.migrate_s  # each move pays at least its fixed part
        assert ran == pytest.approx(x.duration_s[e] + result.paused_s[e])


@pytest.mark.parametrize("mode", ALL_MODES)
def test_executions_start_in_queue_order(runs: dict[str, Result], mode: str) -> None:
    # The task queue is FIFO (the lower bound's model relies on it): execution i never starts
    # before execution i - 1, even when a group's executions wait for slots.
    starts = [intervals[0][1] for intervals in runs[mode].hosting]
    assert starts == sorted(starts)


@pytest.mark.parametrize("mode", ALL_MODES)
def test_staleness_bound_is_respected(runs: dict[str, Result], mode: str) -> None:
    assert max(runs[mode].staleness) <= SMALL["max_staleness"]


@pytest.mark.parametrize("mode", ALL_MODES)
def test_work_is_conserved_and_no_schedule_beats_the_lower_bound(
    runs: dict[str, Result], small: tuple[Workload, Executions], mode: str
) -> None:
    w, x = small
    result = runs[mode]
    shares = result.shares()
    assert sum(shares.values()) == pytest.approx(1.0)
    assert all(v >= -1e-9 for v in shares.values())
    assert result.rollout_busy_s == pytest.approx(sum(x.duration_s) / w.executions_per_cell)
    overhead = w.steps * w.step_overhead_s
    assert result.training_busy_s == pytest.approx(sum(x.tokens) / w.tokens_per_s_per_cell + overhead)
    assert result.wall_s >= lower_bound_s(w, x)


def test_the_simulation_is_deterministic_for_a_seed(small: tuple[Workload, Executions]) -> None:
    w, x = small
    first, again = simulate("gyre", w, x), simulate("gyre", w, x)
    assert (first.wall_s, first.staleness, first.timeline) == (again.wall_s, again.staleness, again.timeline)
    other = parse_workload({**SMALL, "seed": 8}, base_dir=Path("."))
    assert simulate("gyre", other, draw_executions(other)).wall_s != first.wall_s


def test_gyre_switches_migrate_and_beat_the_fixed_split(runs: dict[str, Result]) -> None:
    assert runs["gyre"].num_switches > 0 and runs["gyre"].migrations > 0
    assert runs["async"].num_switches == 0
    assert runs["gyre"].wall_s < runs["async"].wall_s


def test_cli_prints_every_mode_and_draws_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from services.scheduler.sim.cli import main

    workload = tmp_path / "small.yaml"
    workload.write_text(json.dumps(SMALL))  # JSON is YAML
    png = tmp_path / "roles.png"
    assert main([str(workload), "--json", "--plot", str(png)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(report["modes"]) == set(REPORTED)
    for figures in report["modes"].values():
        shares = [figures[k] for k in ("rollout_busy", "training_busy", "idle", "switching", "sync")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
        assert figures["wall_s"] >= report["lower_bound_s"] - 0.1
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    assert main([str(workload), "--ablation", "--json"]) == 0
    ablation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(ablation["variants"]) == set(ABLATION)
    assert all(v["paper_h"] is None for v in ablation["variants"].values())  # not the paper's run


def test_ablation_shows_the_papers_figures_only_beside_the_12_step_workload() -> None:
    from services.scheduler.sim.report import ablation
    from services.scheduler.sim.workload import load_workload

    w = load_workload(
        Path(__file__).resolve().parents[1] / "bench" / "workloads" / "paper-ablation-12step.yaml"
    )
    variants = ablation(w, draw_executions(w))["variants"]
    assert variants["async"]["paper_h"] == 25.08 and variants["gyre"]["paper_h"] == 16.12
    assert variants["elastic_no_streaming"]["paper_h"] is None  # the paper gives no figure for it


def test_every_fixed_split_mode_at_its_best_split_is_no_slower_than_at_the_workloads(
    small: tuple[Workload, Executions],
) -> None:
    from services.scheduler.sim.report import compare, run_modes

    w, x = small
    report = compare(w, x, run_modes(w, x))
    modes = report["modes"]
    for mode in ("async", "async_streaming"):
        assert modes[f"{mode}_best"]["wall_s"] <= modes[mode]["wall_s"]
        assert 1 <= modes[f"{mode}_best"]["rollout_cells"] <= w.cells - 1
    assert modes["burst_best"]["wall_s"] <= min(modes["burst"]["wall_s"], modes["burst_fixed"]["wall_s"])
    best = report["best_baseline"]
    assert best != "gyre" and modes[best]["wall_s"] == min(
        m["wall_s"] for name, m in modes.items() if name != "gyre"
    )
    assert report["gyre_speedup_over_best_baseline"] == pytest.approx(
        modes[best]["wall_s"] / modes["gyre"]["wall_s"], rel=1e-3
    )


@pytest.mark.parametrize("mode", ALL_MODES)
def test_a_steps_first_round_waits_for_its_start(small: tuple[Workload, Executions], mode: str) -> None:
    """`step_start_s`: a step's first group is assigned no earlier than the previous step's end,
    and its first microbatch round begins that long after the assignment."""
    w, x = small
    w = dataclasses.replace(w, step_start_s=30.0)
    result = simulate(mode, w, x, trace=True)
    assert result.steps == w.steps and result.trained_tokens == sum(x.tokens)
    for step_start in [0.0, *result.step_end_s[:-1]]:
        first = min(start for start, _, _ in result.rounds if start >= step_start)
        assert first >= step_start + w.step_start_s


def test_cells_switching_in_while_a_step_starts_train_from_its_first_round() -> None:
    """Live the trainer fetches the samples before the first microbatch, and satellites the policy
    switches in at the assignment join that microbatch. Without a start time, a step of one
    microbatch round runs on the cells already training (here: the core alone). The executions
    and costs are a `bench.live` Gyre run's (it trained with 2, 3, 2, 3, 2, 3 members)."""
    data = {
        **SMALL,
        "cells": 3,
        "steps": 6,
        "groups_per_step": 1,
        "group_size": 2,
        "async_rollout_cells": 2,
        "rollout": {"executions_per_cell": 2, "migrate_s": 0.0},
        "training": {
            "tokens_per_s_per_cell": 100.7,
            "step_overhead_s": 0.34,
            "microbatch_tokens": 4096,
            "group_setup_s": 0.05,
            "weight_bytes": 5.56e6,
        },
        "switch": {"rollout_to_training_s": 0.13, "training_to_rollout_s": 0.18, "link_bytes_per_s": 1e9},
    }
    w = parse_workload(data, base_dir=Path("."))
    x = Executions(
        duration_s=(6.3, 7.2, 10.7, 17.1, 0.9, 2.4, 6.4, 9.9, 0.8, 2.5, 4.8, 8.9),
        tokens=(111, 269, 404, 649, 111, 269, 408, 600, 111, 269, 427, 617),
        timed_out=(False,) * 12,
    )
    at_once = simulate("gyre", w, x, trace=True)
    fetched = simulate("gyre", dataclasses.replace(w, step_start_s=0.2), x, trace=True)
    assert any(members == (0,) for _, _, members in at_once.rounds)
    assert [len(members) for _, _, members in fetched.rounds] == [2, 3, 2, 3, 2, 3]
    assert fetched.wall_s < at_once.wall_s
