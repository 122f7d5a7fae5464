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
    (tmp_path / "runs.jsonl").write_text('{"wall_s": 10}\n{"wall_s": 20}\n\n{"wall_s": 9999}\n')
    trace = {"dist": "trace", "file": "runs.jsonl", "field": "wall_s"}
    w = parse_workload(_with("execution.duration_s", trace), base_dir=tmp_path)
    assert draw_executions(w).duration_s[:4] == (10.0, 20.0, 900.0, 10.0)  # capped, then cycling
    assert sum(draw_executions(w).timed_out) > 0
    with pytest.raises(InvalidArgument, match="no field 'seconds'"):
        parse_workload(_with("execution.duration_s", trace | {"field": "seconds"}), base_dir=tmp_path)
    with pytest.raises(InvalidArgument, match="no such file"):
        parse_workload(_with("execution.duration_s", trace | {"file": "gone.jsonl"}), base_dir=tmp_path)


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
