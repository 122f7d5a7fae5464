"""A live run's measured executions as a `gyre sim` workload trace (pure).

One JSONL record per execution that ended and made model calls:

    {"execution_id": "...", "task_id": "...", "duration_s": 41.2, "tokens": 5210,
     "timed_out": false, "num_calls": 12, "call_latency_s": [0.8, ...],
     "call_output_tokens": [96, ...]}

`duration_s` is how long the harness ran as the scheduler recorded it (the runner's measurement,
carried by its end event); `tokens` the tokens of the execution's selected trajectories (what
training sees after J_max selection), as the workload schema defines it. Records are in admission
order (the scheduler admits the oldest task first), which is the order the simulator replays
them in. The workload file replays both with `{dist: trace, file: <name>.jsonl, field: ...}`; its
other fields are measured where the live services say (group size, groups per step, steps,
staleness bound, timeout) and otherwise taken from the command's options (`bench.live` passes
the costs it measured on the run), and the file's header comment lists which are which.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionTrace:
    execution_id: str
    task_id: str
    duration_s: float
    tokens: int
    timed_out: bool
    num_calls: int
    call_latency_s: list[float] = field(default_factory=list)
    call_output_tokens: list[int] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True, kw_only=True)
class Assumed:
    """Workload fields the live services do not measure (yet): the command's options."""

    cells: int = 4
    async_rollout_cells: int = 2
    executions_per_cell: int = 8
    tokens_per_s_per_cell: float = 20_000.0
    step_overhead_s: float = 10.0
    rollout_to_training_s: float = 8.52
    training_to_rollout_s: float = 3.46
    # Optional costs: None leaves the workload schema's default (`sim.workload`).
    migrate_s: float | None = None
    group_setup_s: float | None = None
    step_start_s: float | None = None
    microbatch_tokens: int | None = None
    weight_bytes: float | None = None
    link_bytes_per_s: float | None = None

    def optional(self, *names: str) -> dict[str, Any]:
        """The named optional costs that were given."""
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    group_sizes: Sequence[int]
    groups_per_step: Sequence[int]
    """Groups each exported step consumed; empty when the tasks were named, not taken from steps."""
    max_staleness: int
    timeouts_s: Sequence[float]


def workload(name: str, trace_file: str, *, measured: Measured, assumed: Assumed) -> dict[str, Any]:
    """The workload mapping `gyre sim` reads, its executions drawn from `trace_file` in order.

    Example:
        group sizes (2, 2, 4), steps that took (1, 2) groups -> group_size 2 (most common),
        groups_per_step 2 (the largest), steps 2
    """
    group_size = Counter(measured.group_sizes).most_common(1)[0][0]
    return {
        "name": name,
        "seed": 0,
        "cells": assumed.cells,
        "steps": max(1, len(measured.groups_per_step)),
        "groups_per_step": max(measured.groups_per_step, default=1),
        "group_size": group_size,
        "max_staleness": measured.max_staleness,
        "async_rollout_cells": assumed.async_rollout_cells,
        "execution": {
            "duration_s": {"dist": "trace", "file": trace_file, "field": "duration_s"},
            "timeout_s": max(measured.timeouts_s),
            "tokens": {"dist": "trace", "file": trace_file, "field": "tokens"},
        },
        "rollout": {"executions_per_cell": assumed.executions_per_cell, **assumed.optional("migrate_s")},
        "training": {
            "tokens_per_s_per_cell": assumed.tokens_per_s_per_cell,
            "step_overhead_s": assumed.step_overhead_s,
            **assumed.optional("microbatch_tokens", "group_setup_s", "step_start_s", "weight_bytes"),
        },
        "switch": {
            "rollout_to_training_s": assumed.rollout_to_training_s,
            "training_to_rollout_s": assumed.training_to_rollout_s,
            **assumed.optional("link_bytes_per_s"),
        },
    }


HEADER = """# Exported by `gyre trace export` from a live run.
# Measured: execution.duration_s and execution.tokens (trace file), group_size, groups_per_step,
#   steps, max_staleness, execution.timeout_s; training.microbatch_tokens unless given (the
#   executions' mean tokens: the trainer makes one microbatch per execution).
# From the command's options (not measured by the live services yet; `bench.live` passes what it
#   measured on its run): cells, async_rollout_cells, rollout.*, training.*, switch.*.
"""
