"""`gyre trace export`'s workload mapping: measured costs given as options reach `gyre sim`; costs
not given keep the schema's defaults (pure)."""

from __future__ import annotations

import json
from pathlib import Path

from gyre_app.cli_trace import Collected, write
from gyre_app.trace_export import Assumed, ExecutionTrace, Measured, workload
from services.scheduler.sim.workload import (
    DEFAULT_GROUP_SETUP_S,
    DEFAULT_MIGRATE_S,
    load_workload,
    parse_workload,
)

MEASURED = Measured(group_sizes=[2, 2, 2], groups_per_step=[1, 1, 1], max_staleness=1, timeouts_s=[600.0] * 3)


def _trace(tmp_path: Path) -> None:
    records = [{"duration_s": 1.0 + i, "tokens": 100 + i} for i in range(6)]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_costs_given_as_options_reach_the_simulators_workload(tmp_path: Path) -> None:
    _trace(tmp_path)
    assumed = Assumed(
        cells=3,
        async_rollout_cells=2,
        executions_per_cell=2,
        tokens_per_s_per_cell=150.0,
        step_overhead_s=0.3,
        rollout_to_training_s=0.4,
        training_to_rollout_s=1.1,
        migrate_s=0.2,
        group_setup_s=0.05,
        step_start_s=0.25,
        microbatch_tokens=4096,
        weight_bytes=5.6e6,
        link_bytes_per_s=1e9,
    )
    w = parse_workload(workload("t", "t.jsonl", measured=MEASURED, assumed=assumed), base_dir=tmp_path)
    assert (w.cells, w.steps, w.group_size, w.executions_per_cell) == (3, 3, 2, 2)
    assert (w.migrate_s, w.group_setup_s, w.microbatch_tokens, w.step_start_s) == (0.2, 0.05, 4096, 0.25)
    assert (w.weight_bytes, w.link_bytes_per_s) == (5.6e6, 1e9)
    assert (w.rollout_to_training_s, w.training_to_rollout_s) == (0.4, 1.1)
    assert w.duration.values == (1.0, 2.0, 3.0, 4.0, 5.0, 6.0)


def test_costs_not_given_keep_the_schemas_defaults(tmp_path: Path) -> None:
    _trace(tmp_path)
    data = workload("t", "t.jsonl", measured=MEASURED, assumed=Assumed(cells=3, async_rollout_cells=2))
    assert "migrate_s" not in data["rollout"] and "group_setup_s" not in data["training"]
    w = parse_workload(data, base_dir=tmp_path)
    assert (w.migrate_s, w.group_setup_s, w.step_start_s) == (DEFAULT_MIGRATE_S, DEFAULT_GROUP_SETUP_S, 0.0)


def test_the_microbatch_defaults_to_an_executions_mean_tokens(tmp_path: Path) -> None:
    """The trainer makes one microbatch per execution: unless given, a simulated round holds one
    execution's tokens."""
    traces = [
        ExecutionTrace(
            execution_id=f"e{i}",
            task_id=f"t{i // 2}",
            duration_s=1.0 + i,
            tokens=100 * (i + 1),
            timed_out=False,
            num_calls=1,
        )
        for i in range(6)
    ]
    collected = Collected(traces=traces, skipped={}, measured=MEASURED)
    summary = write(
        tmp_path, "run", collected, Assumed(cells=3, async_rollout_cells=2, executions_per_cell=2)
    )
    assert load_workload(summary["workload"]).microbatch_tokens == 350  # mean of 100..600
    given = Assumed(cells=3, async_rollout_cells=2, executions_per_cell=2, microbatch_tokens=4096)
    assert load_workload(write(tmp_path, "run2", collected, given)["workload"]).microbatch_tokens == 4096
