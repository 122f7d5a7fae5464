"""`bench.live`'s bookkeeping (pure): the interleaved round order, the costs it measures from a
run's events, the `gyre trace export` command it prints, and its medians per mode."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer

from bench.live import round_orders, summarize
from bench.live_measure import RunRecord, assumed, export_command, measured_costs
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre_app.cli import app


def _record() -> RunRecord:
    record = RunRecord(cells=3, slots=2, weight_bytes=5.6e6)
    # Two steps: 2 s on 1 cell, then 1 s on 2 cells; seen 0.5 s and 0.3 s after their compute ended.
    record.steps = [(2.0, 1, 12.5), (1.0, 2, 20.3)]
    record.step_started = {1: 10.0, 2: 19.0}
    record.switches = [
        pb.CellSwitch(ok=True, to_role=pb.CELL_ROLE_TRAINING, total_s=0.9, drain_s=0.4, num_calls_migrated=1),
        pb.CellSwitch(ok=True, to_role=pb.CELL_ROLE_TRAINING, total_s=0.5, drain_s=0.2),
        pb.CellSwitch(ok=False, to_role=pb.CELL_ROLE_TRAINING, total_s=9.0, drain_s=9.0),
        pb.CellSwitch(ok=True, to_role=pb.CELL_ROLE_ROLLOUT, total_s=1.2),
    ]
    return record


def test_rounds_alternate_the_order_of_the_modes() -> None:
    assert round_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]


def test_costs_come_from_the_runs_steps_and_successful_switches() -> None:
    costs = measured_costs(_record(), trained_tokens=800, fetch_s=[0.1, 0.3, 0.2])
    assert costs.tokens_per_s_per_cell == 200.0  # 800 tokens in 2*1 + 1*2 cell-seconds
    # Outside the compute: median 0.4 (0.5 and 0.3), of which the samples' fetch (median 0.2) first.
    assert (costs.step_start_s, costs.step_overhead_s) == pytest.approx((0.2, 0.2))
    assert costs.rollout_to_training_s == 0.4  # the drain is the migration: 0.5 and 0.3 less it
    assert (costs.training_to_rollout_s, costs.migrate_s) == (1.2, 0.4)


def test_the_printed_export_command_is_one_gyre_trace_export_accepts() -> None:
    record = _record()
    line = export_command(
        Path("/tmp/x"),
        "live-gyre-1",
        assumed(record, measured_costs(record, trained_tokens=800, fetch_s=[0.2])),
    )
    argv = shlex.split(line)
    assert argv[:3] == ["gyre", "trace", "export"]
    command = typer.main.get_command(app).commands["trace"].commands["export"]  # type: ignore[attr-defined]
    params = command.make_context("export", argv[3:]).params
    # The microbatch is left to the export (an execution's mean tokens).
    assert (params["cells"], params["executions_per_cell"], params["microbatch_tokens"]) == (3, 2, None)
    assert params["tokens_per_s_per_cell"] == 200.0 and params["link_bytes_per_s"] == 1e9
    assert params["step_start_s"] == 0.2


def test_each_mode_is_summarised_by_its_medians_and_each_round_by_its_fastest() -> None:
    def run(wall: float, sim: float) -> dict[str, object]:
        return {
            "wall_s": wall,
            "sim_wall_s": sim,
            "sim_rel_err": abs(sim - wall) / wall,
            "busy_share": 0.5,
            "idle_share": 0.5,
            "switching_share": 0.0,
            "num_switches": 0,
            "staleness_max": 1,
            "load_avg": [2.0, 3.0],
        }

    runs = {"gyre": [run(10, 10), run(30, 27), run(12, 12)], "async": [run(11, 11), run(20, 20), run(13, 13)]}
    out = summarize(runs, round_orders(["gyre", "async"], 3))
    assert out["gyre"]["wall_s"] == 12 and out["async"]["wall_s"] == 13  # type: ignore[index]
    assert out["gyre_fastest"] is True and out["gyre_fastest_rounds"] == 2
    assert out["max_sim_rel_err"] == 0.0 and out["max_sim_rel_err_any_run"] == 0.1


def test_an_unknown_workload_is_refused_naming_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.live import main

    with pytest.raises(SystemExit):
        main(["--workload", "huge"])
    assert "--workload" in capsys.readouterr().err
