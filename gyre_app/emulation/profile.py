"""Emulation profiles: an accelerator cell described by sourced figures, and what follows from them (pure
but for reading the YAML file).

EMULATION ONLY. A profile (bench/profiles/*-emulated.yaml) says what one cell is: the model, the
accelerator's datasheet figures, how many accelerators a cell holds, the efficiencies assumed,
the engine's limits, the switch costs. Every figure is `{value: X, source: "..."}`; a figure
without a source, with a value that cannot be (an MFU above 1, a model larger than the cell's
memory), or a field the schema does not know is refused with the field's path, so a typo never
falls back to a default.

From one profile come both the emulated engines' timing (`engine_timing`) and the simulator's
costs (`workload_costs`): one timing model for live runs and `gyre sim`, so a difference between
the two is the control plane's, not the model's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gyre.errors import InvalidArgument
from services.engine.emulated_timing import EngineTiming

LABEL = "emulation only"
_SCHEMA: dict[str, dict[str, str]] = {
    # section -> field -> kind: "pos" (> 0), "frac" (0 < x <= 1), "int" (integer >= 1), "cost" (>= 0)
    "model": {
        "parameters": "pos",
        "active_parameters": "pos",
        "num_layers": "int",
        "num_kv_heads": "int",
        "head_dim": "int",
        "bytes_per_parameter": "pos",
        "kv_bytes_per_element": "pos",
        "max_context_tokens": "int",
    },
    "accelerator": {"memory_bytes": "pos", "memory_bytes_per_s": "pos", "peak_flops": "pos"},
    "cell": {"accelerators": "int", "link_bytes_per_s": "pos", "weight_load_bytes_per_s": "pos"},
    "efficiency": {
        "memory_bandwidth_utilisation": "frac",
        "decode_mfu": "frac",
        "prefill_mfu": "frac",
        "training_mfu": "frac",
    },
    "engine": {"max_num_seqs": "int", "memory_fraction": "frac"},
    "switch": {"rollout_to_training_s": "cost", "training_to_rollout_s": "cost", "group_setup_s": "cost"},
    "emulator": {"bytes_per_cell": "pos"},
}
_NAMES = {"model", "accelerator"}
"""Sections that also carry a `name` (plain text, no source)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Figure:
    value: float
    source: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    name: str
    model_name: str
    accelerator_name: str
    figures: Mapping[str, Figure]
    """`section.field` -> figure, every one sourced."""

    def __getitem__(self, path: str) -> float:
        return self.figures[path].value

    @property
    def fingerprint(self) -> str:
        """What every emulated cell of this profile reports as its model: cells of two profiles
        never form one cluster, and no KV moves between them."""
        return f"emulated:{self.name}:{self.model_name}"

    @property
    def weight_bytes(self) -> float:
        return self["model.parameters"] * self["model.bytes_per_parameter"]

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of every layer and KV head. Example: 94 x 4 x 128 x 2 x 2 B = 192,512 B."""
        m = "model."
        return (
            2.0
            * self[m + "num_layers"]
            * self[m + "num_kv_heads"]
            * self[m + "head_dim"]
            * self[m + "kv_bytes_per_element"]
        )

    @property
    def cell_memory_bytes(self) -> float:
        return self["cell.accelerators"] * self["accelerator.memory_bytes"] * self["engine.memory_fraction"]

    @property
    def kv_capacity_tokens(self) -> int:
        return int((self.cell_memory_bytes - self.weight_bytes) // self.kv_bytes_per_token)

    @property
    def training_tokens_per_s_per_cell(self) -> float:
        """6 FLOPs per active parameter and token (forward and backward) at the training MFU."""
        peak = self["cell.accelerators"] * self["accelerator.peak_flops"]
        return peak * self["efficiency.training_mfu"] / (6.0 * self["model.active_parameters"])


def engine_timing(p: Profile) -> EngineTiming:
    cell = p["cell.accelerators"]
    return EngineTiming(
        weight_bytes=p.weight_bytes,
        kv_bytes_per_token=p.kv_bytes_per_token,
        memory_bytes_per_s=cell
        * p["accelerator.memory_bytes_per_s"]
        * p["efficiency.memory_bandwidth_utilisation"],
        flops_per_token=2.0 * p["model.active_parameters"],
        decode_flops_per_s=cell * p["accelerator.peak_flops"] * p["efficiency.decode_mfu"],
        prefill_flops_per_s=cell * p["accelerator.peak_flops"] * p["efficiency.prefill_mfu"],
        max_num_seqs=int(p["engine.max_num_seqs"]),
        kv_capacity_tokens=p.kv_capacity_tokens,
        link_bytes_per_s=p["cell.link_bytes_per_s"],
        weight_load_bytes_per_s=p["cell.weight_load_bytes_per_s"],
    )


def workload_costs(p: Profile) -> dict[str, dict[str, float]]:
    """The simulator's workload fields this profile decides (merged over a workload's own).

    `step_overhead_s` is the new weights' load on a rollout cell (the publish is a local write).
    """
    return {
        "rollout": {
            "kv_bytes_per_token": p.kv_bytes_per_token,
            "max_context_tokens": int(p["model.max_context_tokens"]),
        },
        "training": {
            "tokens_per_s_per_cell": p.training_tokens_per_s_per_cell,
            "weight_bytes": p.weight_bytes,
            "group_setup_s": p["switch.group_setup_s"],
            "step_overhead_s": p.weight_bytes / p["cell.weight_load_bytes_per_s"],
        },
        "switch": {
            "rollout_to_training_s": p["switch.rollout_to_training_s"],
            "training_to_rollout_s": p["switch.training_to_rollout_s"],
            "link_bytes_per_s": p["cell.link_bytes_per_s"],
        },
    }


def _figure(value: object, path: str, kind: str) -> Figure:
    if not isinstance(value, Mapping) or set(value) != {"value", "source"}:
        raise InvalidArgument(
            path, f"must be {{value: <number>, source: <where it comes from>}}, got {value!r}"
        )
    source = value["source"]
    if not isinstance(source, str) or not source.strip():
        raise InvalidArgument(
            f"{path}.source", "must name where the figure comes from (a datasheet, a config, a paper)"
        )
    x = value["value"]
    if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
        raise InvalidArgument(f"{path}.value", f"must be a number, got {x!r}")
    ok = {
        "pos": x > 0,
        "frac": 0 < x <= 1,
        "int": isinstance(x, int) and x >= 1,
        "cost": x >= 0,
    }[kind]
    if not ok:
        expected = {"pos": "> 0", "frac": "in (0, 1]", "int": "an integer >= 1", "cost": ">= 0"}[kind]
        raise InvalidArgument(f"{path}.value", f"must be {expected}, got {x!r}")
    return Figure(value=float(x), source=source.strip())


def parse_profile(data: object) -> Profile:
    if not isinstance(data, Mapping):
        raise InvalidArgument("profile", f"must be a mapping, got {type(data).__name__}")
    allowed = {"name", "label", *_SCHEMA}
    for key in data:
        if key not in allowed:
            raise InvalidArgument(str(key), f"unknown field; expected one of {sorted(allowed)}")
    for key in ("name", "label", *_SCHEMA):
        if key not in data:
            raise InvalidArgument(key, "is required")
    if data["label"] != LABEL:
        raise InvalidArgument("label", f"must be {LABEL!r}: an emulated cluster is always labelled so")
    if not isinstance(data["name"], str) or not data["name"].strip():
        raise InvalidArgument("name", f"must be a non-empty string, got {data['name']!r}")
    figures: dict[str, Figure] = {}
    names: dict[str, str] = {}
    for section, fields in _SCHEMA.items():
        body = data[section]
        if not isinstance(body, Mapping):
            raise InvalidArgument(section, f"must be a mapping, got {type(body).__name__}")
        known = set(fields) | ({"name"} if section in _NAMES else set())
        for key in body:
            if key not in known:
                raise InvalidArgument(f"{section}.{key}", f"unknown field; expected one of {sorted(known)}")
        for key in sorted(known):
            if key not in body:
                raise InvalidArgument(f"{section}.{key}", "is required")
        if section in _NAMES:
            if not isinstance(body["name"], str) or not body["name"].strip():
                raise InvalidArgument(f"{section}.name", "must be a non-empty string")
            names[section] = body["name"].strip()
        for key, kind in fields.items():
            figures[f"{section}.{key}"] = _figure(body[key], f"{section}.{key}", kind)
    profile = Profile(
        name=data["name"].strip(),
        model_name=names["model"],
        accelerator_name=names["accelerator"],
        figures=figures,
    )
    _check_consistent(profile)
    return profile


def _check_consistent(p: Profile) -> None:
    """Figures each possible alone but impossible together."""
    if p["model.active_parameters"] > p["model.parameters"]:
        raise InvalidArgument(
            "model.active_parameters.value",
            f"{p['model.active_parameters']:.4g} exceeds the model's {p['model.parameters']:.4g} parameters",
        )
    context = int(p["model.max_context_tokens"])
    if p.kv_capacity_tokens < context:
        raise InvalidArgument(
            "cell.accelerators.value",
            f"{int(p['cell.accelerators'])} x {p['accelerator.memory_bytes'] / 1e9:.0f} GB at "
            f"memory_fraction {p['engine.memory_fraction']} hold {p.cell_memory_bytes / 1e9:.0f} GB: "
            f"the weights ({p.weight_bytes / 1e9:.0f} GB) leave KV room for "
            f"{max(p.kv_capacity_tokens, 0)} tokens, less than one {context}-token context",
        )


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument("profile", f"no such file: {path}")
    try:
        data: Any = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise InvalidArgument("profile", f"{path.name} is not valid YAML: {exc}") from exc
    return parse_profile(data)


def check_cells(p: Profile, cells: int, *, available_bytes: int) -> None:
    """Refuse a cluster this machine cannot hold: at least a core and a satellite, and the
    emulated cells' measured memory (`emulator.bytes_per_cell`) within what is available."""
    if cells < 2:
        raise InvalidArgument("cells", f"at least 2 (a core and one satellite), got {cells}")
    need = cells * p["emulator.bytes_per_cell"]
    if need > available_bytes:
        raise InvalidArgument(
            "cells",
            f"{cells} emulated cells need about {need / 2**20:.0f} MiB "
            f"({p['emulator.bytes_per_cell'] / 2**20:.1f} MiB each, emulator.bytes_per_cell); "
            f"this machine has {available_bytes / 2**20:.0f} MiB available",
        )
