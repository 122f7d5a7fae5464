"""Golden outputs of `gyre sim --json`: every figure the simulator prints stays the same.

The expected reports (`sim_golden_expected.json`) were recorded by the simulator before its speed
work (issue 25, build 6: cached event views, a counted `groups_for_step`, sweeps that stop a split
once it cannot be the best and run in several processes); any change to a wall time, a share, a
best split or a bound fails here. The reference workloads run at reduced size (fewer steps) so
the whole file takes seconds.

Recording them again, only after a deliberate change to the model:
    python -m tests.test_sim_golden
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from services.scheduler.sim.cli import main as sim_main

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = Path(__file__).resolve().parent / "sim_golden_expected.json"

# The synthetic 1,024-cell case of `bench.sim` at 64 cells (its sweep still spreads 24 splits and
# refines around the best, as at 1,024).
SYNTHETIC_64: dict[str, Any] = {
    "name": "synthetic-64",
    "seed": 1024,
    "cells": 64,
    "steps": 4,
    "groups_per_step": 32,
    "group_size": 8,
    "max_staleness": 2,
    "async_rollout_cells": 40,
    "execution": {
        "duration_s": {"dist": "lognormal", "median": 2400, "sigma": 0.6},
        "timeout_s": 7200,
        "tokens": {"dist": "lognormal", "median": 200000, "sigma": 0.5},
    },
    "rollout": {"executions_per_cell": 8},
    "training": {"tokens_per_s_per_cell": 2000, "step_overhead_s": 120},
    "switch": {"rollout_to_training_s": 8.52, "training_to_rollout_s": 3.46},
}

# case -> (workload file or inline workload, fields replaced, extra `gyre sim` arguments)
CASES: dict[str, tuple[str | dict[str, Any], dict[str, Any], list[str]]] = {
    "paper-2.4t-8-steps": ("bench/workloads/paper-2.4t.yaml", {"steps": 8}, []),
    "paper-ablation-12step": ("bench/workloads/paper-ablation-12step.yaml", {}, []),
    "paper-ablation-12step-ablation": ("bench/workloads/paper-ablation-12step.yaml", {}, ["--ablation"]),
    "short-math-6-steps": ("bench/workloads/short-math.yaml", {"steps": 6}, []),
    "cpu-cells": ("bench/profiles/cpu-cells.yaml", {}, []),
    "synthetic-64": (SYNTHETIC_64, {}, []),
}


def report(case: str, tmp_dir: Path, *, jobs: int = 3) -> Any:
    """What `gyre sim FILE --json --jobs JOBS [ARGS]` prints for `case`, decoded."""
    source, fields, args = CASES[case]
    data = dict(source) if isinstance(source, dict) else yaml.safe_load((ROOT / source).read_text())
    data.update(fields)
    path = tmp_dir / f"{case}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert sim_main([str(path), "--json", "--jobs", str(jobs), *args]) == 0
    return json.loads(out.getvalue())


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_matches_golden(case: str, tmp_path: Path) -> None:
    expected = json.loads(EXPECTED.read_text())[case]
    assert report(case, tmp_path) == expected


@pytest.mark.parametrize("case", ["synthetic-64"])
def test_sweeps_in_one_process_print_the_same(case: str, tmp_path: Path) -> None:
    # The pool's runs start with whatever best so far has come back; one process runs in order.
    expected = json.loads(EXPECTED.read_text())[case]
    assert report(case, tmp_path, jobs=1) == expected


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        golden = {case: report(case, Path(tmp)) for case in sorted(CASES)}
    EXPECTED.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTED} ({len(golden)} cases)", file=sys.stderr)
