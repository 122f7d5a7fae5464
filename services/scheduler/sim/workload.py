"""Workload files for `gyre sim`: parse, validate, and draw the run's executions (pure but for
reading the YAML file and recorded traces).

Schema: ../shared/workloads/README.md (copied verbatim in bench/workloads/). Optional fields this
simulator adds, with their defaults (the costs elasticity pays; where each default comes from is
in docs/design/scheduling.md):

    training.microbatch_tokens: 32768      # a satellite joins or leaves a step between microbatches
    training.group_setup_s: 2.0            # forming the data-parallel group anew when its members change
    training.step_start_s: 0.0             # from a step's first group assigned to its first microbatch
                                           # (the trainer fetching the samples); cells that finish
                                           # switching in meanwhile train from the first microbatch
    training.weight_bytes: <derived>       # bytes of one replica's weights (= its bf16 gradients);
                                           # default 2 * CELL_FLOPS / (6 * tokens_per_s_per_cell)
    rollout.migrate_s: 5.0                 # fixed pause of a moved execution (pause, hand-over, resume)
    rollout.kv_bytes_per_token: 192512     # KV cache per context token that a move carries
    rollout.max_context_tokens: 131072     # the most context (so KV) one execution holds
    switch.link_bytes_per_s: 4.0e11        # one cell's network: KV moves, weight broadcast, all-reduce

Times that must elapse for work to happen (durations, the timeout, the training rate) must be
> 0; costs (switches, the update, migration, group set-up) may be 0. A `trace` must hold at least
one record per execution of the run (it is replayed in order, not cycled).

Every error names the field path, e.g. `execution.duration_s.sigma: must be a number >= 0, got 'x'`.
Unknown keys are refused too, so a typo cannot silently fall back to a default.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre.errors import InvalidArgument

# GPU-cell defaults for the paper workloads: published figures and arithmetic, none measured here
# (no GPU); sources in docs/design/scheduling.md. CPU-cell figures measured here are in
# bench/profiles/cpu-cells.yaml.
DEFAULT_MICROBATCH_TOKENS = 32768
DEFAULT_MIGRATE_S = 5.0  # a conservative fixed pause (issue 5's figure), not a measurement
DEFAULT_GROUP_SETUP_S = 2.0  # NVIDIA/nccl#534: 8 communicators of 8 ranks in 16.3 s
# Qwen3-235B-A22B's published shape: 94 layers x 4 KV heads x 128 dims x (K, V) x 2 bytes bf16
DEFAULT_KV_BYTES_PER_TOKEN = 192_512
DEFAULT_MAX_CONTEXT_TOKENS = 131_072
DEFAULT_LINK_BYTES_PER_S = 4.0e11  # 8 GPUs per cell, one 400 Gb/s ConnectX-7 NIC each
# Training throughput of one cell (8 H100 x 989.4 TFLOP/s dense bf16 x 40 % MFU; Llama 3
# reports 38-43 %): with 6 FLOPs per parameter and token it sizes the model, so its weights,
# when a workload does not say.
CELL_FLOPS = 3.2e15


@dataclass(frozen=True, slots=True, kw_only=True)
class Dist:
    """`lognormal` (median, sigma), `const` (value) or `trace` (values replayed in order)."""

    kind: str
    median: float = 0.0
    sigma: float = 0.0
    value: float = 0.0
    values: tuple[float, ...] = ()

    def draw(self, rng: random.Random, index: int) -> float:
        if self.kind == "const":
            return self.value
        if self.kind == "trace":
            return self.values[index]
        return math.exp(math.log(self.median) + self.sigma * rng.gauss(0.0, 1.0))


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    name: str
    seed: int
    cells: int
    steps: int
    groups_per_step: int
    group_size: int
    max_staleness: int
    async_rollout_cells: int
    duration: Dist
    timeout_s: float
    tokens: Dist
    executions_per_cell: int
    tokens_per_s_per_cell: float
    step_overhead_s: float
    rollout_to_training_s: float
    training_to_rollout_s: float
    microbatch_tokens: int = DEFAULT_MICROBATCH_TOKENS
    migrate_s: float = DEFAULT_MIGRATE_S
    group_setup_s: float = DEFAULT_GROUP_SETUP_S
    step_start_s: float = 0.0
    weight_bytes: float | None = None  # None: derived from the training rate (`replica_bytes`)
    kv_bytes_per_token: float = DEFAULT_KV_BYTES_PER_TOKEN
    max_context_tokens: int = DEFAULT_MAX_CONTEXT_TOKENS
    link_bytes_per_s: float = DEFAULT_LINK_BYTES_PER_S

    @property
    def replica_bytes(self) -> float:
        """Bytes of one training replica's weights, and of the gradients it all-reduces."""
        if self.weight_bytes is not None:
            return self.weight_bytes
        return 2.0 * CELL_FLOPS / (6.0 * self.tokens_per_s_per_cell)

    @property
    def join_s(self) -> float:
        """What a satellite pays on top of its switch to join training: the weight broadcast."""
        return self.replica_bytes / self.link_bytes_per_s

    def allreduce_s(self, replicas: int) -> float:
        """One ring all-reduce of the gradients over `replicas` cells: 2 (n - 1) / n of them cross
        each cell's link. Example: 1e12 bytes, 4e11 B/s, 4 replicas -> 1.5 * 2.5 = 3.75 s."""
        if replicas <= 1:
            return 0.0
        return 2.0 * (replicas - 1) / replicas * self.replica_bytes / self.link_bytes_per_s

    @property
    def total_groups(self) -> int:
        return self.steps * self.groups_per_step

    @property
    def total_executions(self) -> int:
        return self.total_groups * self.group_size


@dataclass(frozen=True, slots=True, kw_only=True)
class Executions:
    """The run's executions, group g holding indices g*G .. g*G+G-1."""

    duration_s: tuple[float, ...]  # capped at the timeout
    tokens: tuple[int, ...]
    timed_out: tuple[bool, ...]


_TOP = {
    "name", "seed", "cells", "steps", "groups_per_step", "group_size", "max_staleness",
    "async_rollout_cells", "execution", "rollout", "training", "switch",
}  # fmt: skip
_SECTIONS = {
    "execution": {"duration_s", "timeout_s", "tokens"},
    "rollout": {"executions_per_cell", "migrate_s", "kv_bytes_per_token", "max_context_tokens"},
    "training": {
        "tokens_per_s_per_cell", "step_overhead_s", "microbatch_tokens", "group_setup_s", "weight_bytes",
        "step_start_s",
    },
    "switch": {"rollout_to_training_s", "training_to_rollout_s", "link_bytes_per_s"},
}  # fmt: skip
_REQUIRED_IN = {
    "execution": {"duration_s", "timeout_s", "tokens"},
    "rollout": {"executions_per_cell"},
    "training": {"tokens_per_s_per_cell", "step_overhead_s"},
    "switch": {"rollout_to_training_s", "training_to_rollout_s"},
}


def _mapping(value: object, field: str, allowed: set[str], required: set[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(field or "workload", f"must be a mapping, got {type(value).__name__}")
    prefix = f"{field}." if field else ""
    for key in value:
        if key not in allowed:
            raise InvalidArgument(f"{prefix}{key}", f"unknown field; expected one of {sorted(allowed)}")
    for key in sorted(required):
        if key not in value:
            raise InvalidArgument(f"{prefix}{key}", "is required")
    return value


def _int(value: object, field: str, *, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidArgument(field, f"must be an integer >= {low}, got {value!r}")
    return value


def _num(value: object, field: str, *, positive: bool) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (positive and value <= 0) or (not positive and value < 0):  # type: ignore[operator]
        raise InvalidArgument(field, f"must be a number {'> 0' if positive else '>= 0'}, got {value!r}")
    return float(value)  # type: ignore[arg-type]


def _dist(value: object, field: str, base_dir: Path) -> Dist:
    if not isinstance(value, Mapping) or "dist" not in value:
        raise InvalidArgument(field, f"must be {{dist: lognormal|const|trace, ...}}, got {value!r}")
    kind = value["dist"]
    if kind == "lognormal":
        _mapping(value, field, {"dist", "median", "sigma"}, {"median", "sigma"})
        return Dist(
            kind=kind,
            median=_num(value["median"], f"{field}.median", positive=True),
            sigma=_num(value["sigma"], f"{field}.sigma", positive=False),
        )
    if kind == "const":
        _mapping(value, field, {"dist", "value"}, {"value"})
        return Dist(kind=kind, value=_num(value["value"], f"{field}.value", positive=True))
    if kind == "trace":
        _mapping(value, field, {"dist", "file", "field"}, {"file", "field"})
        return Dist(kind=kind, values=_trace(value["file"], value["field"], field, base_dir))
    raise InvalidArgument(f"{field}.dist", f"must be lognormal, const or trace, got {kind!r}")


def _trace(file: object, name: object, field: str, base_dir: Path) -> tuple[float, ...]:
    if not isinstance(file, str) or not file:
        raise InvalidArgument(f"{field}.file", f"must be a path to a JSONL file, got {file!r}")
    if not isinstance(name, str) or not name:
        raise InvalidArgument(f"{field}.field", f"must be a field name, got {name!r}")
    path = (base_dir / file) if not Path(file).is_absolute() else Path(file)
    if not path.is_file():
        raise InvalidArgument(f"{field}.file", f"no such file: {path}")
    values: list[float] = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InvalidArgument(
                f"{field}.file", f"{path.name} line {number}: not JSON ({exc.msg})"
            ) from exc
        if not isinstance(record, Mapping) or name not in record:
            raise InvalidArgument(f"{field}.field", f"{path.name} line {number} has no field {name!r}")
        values.append(_num(record[name], f"{field} ({path.name} line {number})", positive=True))
    if not values:
        raise InvalidArgument(f"{field}.file", f"{path.name} holds no records")
    return tuple(values)


def parse_workload(data: object, *, base_dir: Path) -> Workload:
    top = _mapping(data, "", _TOP, _TOP)
    s = {name: _mapping(top[name], name, _SECTIONS[name], _REQUIRED_IN[name]) for name in _SECTIONS}
    if not isinstance(top["name"], str) or not top["name"].strip():
        raise InvalidArgument("name", f"must be a non-empty string, got {top['name']!r}")
    cells = _int(top["cells"], "cells", low=2)
    group_size = _int(top["group_size"], "group_size", low=1)
    slots = _int(s["rollout"]["executions_per_cell"], "rollout.executions_per_cell", low=1)
    rollout_cells = _int(top["async_rollout_cells"], "async_rollout_cells", low=1)
    if rollout_cells >= cells:
        raise InvalidArgument("async_rollout_cells", f"must leave a training cell: < cells ({cells})")
    if rollout_cells * slots < group_size:
        raise InvalidArgument(
            "async_rollout_cells",
            f"{rollout_cells} cells x {slots} slots cannot hold one group of {group_size} executions",
        )
    rollout, training, switch = s["rollout"], s["training"], s["switch"]
    workload = Workload(
        name=top["name"],
        seed=_int(top["seed"], "seed", low=0),
        cells=cells,
        steps=_int(top["steps"], "steps", low=1),
        groups_per_step=_int(top["groups_per_step"], "groups_per_step", low=1),
        group_size=group_size,
        max_staleness=_int(top["max_staleness"], "max_staleness", low=0),
        async_rollout_cells=rollout_cells,
        duration=_dist(s["execution"]["duration_s"], "execution.duration_s", base_dir),
        timeout_s=_num(s["execution"]["timeout_s"], "execution.timeout_s", positive=True),
        tokens=_dist(s["execution"]["tokens"], "execution.tokens", base_dir),
        executions_per_cell=slots,
        migrate_s=_num(rollout.get("migrate_s", DEFAULT_MIGRATE_S), "rollout.migrate_s", positive=False),
        kv_bytes_per_token=_num(
            rollout.get("kv_bytes_per_token", DEFAULT_KV_BYTES_PER_TOKEN),
            "rollout.kv_bytes_per_token",
            positive=False,
        ),
        max_context_tokens=_int(
            rollout.get("max_context_tokens", DEFAULT_MAX_CONTEXT_TOKENS), "rollout.max_context_tokens", low=1
        ),
        tokens_per_s_per_cell=_num(
            training["tokens_per_s_per_cell"], "training.tokens_per_s_per_cell", positive=True
        ),
        step_overhead_s=_num(training["step_overhead_s"], "training.step_overhead_s", positive=False),
        microbatch_tokens=_int(
            training.get("microbatch_tokens", DEFAULT_MICROBATCH_TOKENS), "training.microbatch_tokens", low=1
        ),
        group_setup_s=_num(
            training.get("group_setup_s", DEFAULT_GROUP_SETUP_S), "training.group_setup_s", positive=False
        ),
        step_start_s=_num(training.get("step_start_s", 0.0), "training.step_start_s", positive=False),
        weight_bytes=(
            _num(training["weight_bytes"], "training.weight_bytes", positive=False)
            if "weight_bytes" in training
            else None
        ),
        rollout_to_training_s=_num(
            switch["rollout_to_training_s"], "switch.rollout_to_training_s", positive=False
        ),
        training_to_rollout_s=_num(
            switch["training_to_rollout_s"], "switch.training_to_rollout_s", positive=False
        ),
        link_bytes_per_s=_num(
            switch.get("link_bytes_per_s", DEFAULT_LINK_BYTES_PER_S), "switch.link_bytes_per_s", positive=True
        ),
    )
    for field, dist in (("execution.duration_s", workload.duration), ("execution.tokens", workload.tokens)):
        if dist.kind == "trace" and len(dist.values) < workload.total_executions:
            raise InvalidArgument(
                f"{field}.file",
                f"holds {len(dist.values)} records; the run needs one per execution:"
                f" {workload.total_executions} (steps x groups_per_step x group_size)",
            )
    return workload


def load_workload(path: str | Path, *, costs: Mapping[str, Mapping[str, float]] | None = None) -> Workload:
    """Read a workload file; `costs` (section -> field -> value) replace its own figures, e.g. an
    emulation profile's, so that the simulator and the emulated cells share one timing model."""
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument("workload", f"no such file: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InvalidArgument("workload", f"{path.name} is not valid YAML: {exc}") from exc
    if costs and isinstance(data, dict):
        for section, values in costs.items():
            if isinstance(data.get(section), dict):
                data[section] = {**data[section], **values}
    return parse_workload(data, base_dir=path.parent)


def draw_executions(workload: Workload) -> Executions:
    """Every execution of the run, drawn from the workload's seed (one stream per quantity)."""
    duration_rng = random.Random(f"{workload.seed}:duration_s")
    tokens_rng = random.Random(f"{workload.seed}:tokens")
    raw = [workload.duration.draw(duration_rng, i) for i in range(workload.total_executions)]
    tokens = [max(1, round(workload.tokens.draw(tokens_rng, i))) for i in range(workload.total_executions)]
    return Executions(
        duration_s=tuple(min(d, workload.timeout_s) for d in raw),
        tokens=tuple(tokens),
        timed_out=tuple(d >= workload.timeout_s for d in raw),
    )
