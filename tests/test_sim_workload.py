"""Workload files: the committed copies, and clear errors for bad ones."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from gyre.errors import InvalidArgument
from services.scheduler.sim.workload import draw_executions, load_workload, parse_workload
from tests.test_sim_engine import SMALL

REPO = Path(__file__).resolve().parent.parent
COPIES = REPO / "bench" / "workloads"
NAMES = ("paper-2.4t.yaml", "paper-ablation-12step.yaml", "short-math.yaml")


def _shared() -> Path | None:
    # CI lays shared/ beside the checkout, as the development machine does.
    candidate = REPO.parent / "shared" / "workloads"
    return candidate if candidate.is_dir() else None


@pytest.mark.parametrize("name", NAMES)
def test_committed_workloads_are_verbatim_copies_of_the_shared_ones(name: str) -> None:
    shared = _shared()
    if shared is None:
        pytest.skip("no ../shared/workloads beside this checkout to compare the copies with")
    assert (COPIES / name).read_bytes() == (shared / name).read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_committed_workloads_load(name: str) -> None:
    w = load_workload(COPIES / name)
    assert w.total_executions == w.steps * w.groups_per_step * w.group_size


def _with(path: str, value: object) -> dict[str, Any]:
    data = copy.deepcopy(SMALL)
    *parents, last = path.split(".")
    node = data
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("cells", 1, "cells"),
        ("cells", "many", "cells"),
        ("steps", _DELETE, "steps"),
        ("group_size", True, "group_size"),
        ("async_rollout_cells", 6, "async_rollout_cells"),
        ("execution.duration_s", {"dist": "weibull"}, "execution.duration_s.dist"),
        (
            "execution.duration_s",
            {"dist": "lognormal", "median": -3, "sigma": 1},
            "execution.duration_s.median",
        ),
        ("execution.tokens", 5, "execution.tokens"),
        ("execution.timeout_s", float("nan"), "execution.timeout_s"),
        ("training.tokens_per_s_per_cel", 1, "training.tokens_per_s_per_cel"),
        ("switch", [], "switch"),
        ("rollout.executions_per_cell", 0, "rollout.executions_per_cell"),
        ("async_rollout_cells", 0, "async_rollout_cells"),
        ("execution.timeout_s", 0, "execution.timeout_s"),
        ("execution.duration_s", {"dist": "const", "value": 0}, "execution.duration_s.value"),
        ("training.tokens_per_s_per_cell", 0, "training.tokens_per_s_per_cell"),
        ("training.step_overhead_s", -1, "training.step_overhead_s"),
        ("training.group_setup_s", -0.5, "training.group_setup_s"),
        ("training.weight_bytes", "7B", "training.weight_bytes"),
        ("switch.rollout_to_training_s", -8.52, "switch.rollout_to_training_s"),
        ("switch.link_bytes_per_s", 0, "switch.link_bytes_per_s"),
        ("rollout.migrate_s", -1, "rollout.migrate_s"),
        ("rollout.kv_bytes_per_token", float("inf"), "rollout.kv_bytes_per_token"),
        ("rollout.max_context_tokens", 0, "rollout.max_context_tokens"),
    ],
)
def test_bad_workloads_name_the_field(path: str, value: object, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        parse_workload(_with(path, value), base_dir=Path("."))
    assert caught.value.field == field


def test_a_pool_too_small_for_one_group_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="cannot hold one group"):
        parse_workload(_with("async_rollout_cells", 1) | {"group_size": 5}, base_dir=Path("."))


def test_traces_are_replayed_in_order_and_bad_traces_are_refused(tmp_path: Path) -> None:
    runs = [10, 20, 9999, *range(1, 58)]  # SMALL runs 60 executions
    (tmp_path / "runs.jsonl").write_text("\n".join(f'{{"wall_s": {d}}}' for d in runs) + "\n\n")
    trace = {"dist": "trace", "file": "runs.jsonl", "field": "wall_s"}
    w = parse_workload(_with("execution.duration_s", trace), base_dir=tmp_path)
    assert draw_executions(w).duration_s[:4] == (10.0, 20.0, 900.0, 1.0)  # in order, capped
    assert sum(draw_executions(w).timed_out) == 1
    with pytest.raises(InvalidArgument, match="no field 'seconds'"):
        parse_workload(_with("execution.duration_s", trace | {"field": "seconds"}), base_dir=tmp_path)
    with pytest.raises(InvalidArgument, match="no such file"):
        parse_workload(_with("execution.duration_s", trace | {"file": "gone.jsonl"}), base_dir=tmp_path)


def test_a_trace_shorter_than_the_run_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs.jsonl").write_text('{"wall_s": 10}\n{"wall_s": 20}\n')
    trace = {"dist": "trace", "file": "runs.jsonl", "field": "wall_s"}
    with pytest.raises(
        InvalidArgument, match="holds 2 records; the run needs one per execution: 60"
    ) as caught:
        parse_workload(_with("execution.duration_s", trace), base_dir=tmp_path)
    assert caught.value.field == "execution.duration_s.file"


def test_the_costs_elasticity_pays_default_when_absent() -> None:
    w = parse_workload(SMALL, base_dir=Path("."))
    # No weight size given: the model is sized from the training rate (1,000 tokens/s per cell).
    assert w.replica_bytes == pytest.approx(2 * 3.2e15 / 6000)
    assert w.join_s == pytest.approx(w.replica_bytes / 4.0e11)
    assert w.allreduce_s(1) == 0.0
    assert w.allreduce_s(4) == pytest.approx(1.5 * w.replica_bytes / 4.0e11)


def test_a_missing_or_broken_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="no such file"):
        load_workload(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("cells: [1, 2\n")
    with pytest.raises(InvalidArgument, match="not valid YAML"):
        load_workload(broken)


def test_cli_reports_a_bad_workload_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from services.scheduler.sim.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\n")
    assert main([str(bad)]) == 2
    assert "async_rollout_cells: is required" in capsys.readouterr().err


def test_the_cpu_profile_loads_with_its_measured_costs() -> None:
    w = load_workload(REPO / "bench" / "profiles" / "cpu-cells.yaml")
    # The figures bench/profiles/cpu-cells.yaml names as measured (bench.role_switch, bench.engine,
    # bench.trainer), not the simulator's GPU defaults.
    assert (w.migrate_s, w.kv_bytes_per_token, w.tokens_per_s_per_cell) == (0.30, 1024, 2763)
    assert w.group_setup_s < 1 and w.link_bytes_per_s < 1e9
