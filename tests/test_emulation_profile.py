"""Emulation profiles (emulation only): every figure sourced, impossible figures and clusters the
machine cannot hold refused with the field named, and the roofline the emulated engines spend."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from gyre.errors import InvalidArgument
from gyre_app.emulation.profile import check_cells, engine_timing, load_profile, parse_profile, workload_costs
from services.engine.emulated_timing import advance
from services.scheduler.sim.workload import parse_workload

REPO = Path(__file__).resolve().parents[1]
PROFILES = sorted((REPO / "bench" / "profiles").glob("*-emulated.yaml"))


def raw(name: str = "h100-emulated") -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((REPO / "bench" / "profiles" / f"{name}.yaml").read_text())
    return copy.deepcopy(data)


def refused(data: dict[str, Any]) -> str:
    with pytest.raises(InvalidArgument) as err:
        parse_profile(data)
    return err.value.field


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_every_shipped_profile_loads_and_names_a_source_for_each_figure(path: Path) -> None:
    profile = load_profile(path)
    assert all(f.source for f in profile.figures.values())
    assert profile.kv_capacity_tokens >= profile["model.max_context_tokens"]


def test_a_figure_without_a_source_is_refused_naming_it() -> None:
    data = raw()
    data["accelerator"]["memory_bytes_per_s"]["source"] = " "
    assert refused(data) == "accelerator.memory_bytes_per_s.source"


def test_a_missing_figure_is_refused_naming_it() -> None:
    data = raw()
    del data["efficiency"]["decode_mfu"]
    assert refused(data) == "efficiency.decode_mfu"


def test_an_mfu_above_one_is_refused() -> None:
    data = raw()
    data["efficiency"]["training_mfu"]["value"] = 1.4
    assert refused(data) == "efficiency.training_mfu.value"


def test_more_active_than_total_parameters_is_refused() -> None:
    data = raw()
    data["model"]["active_parameters"]["value"] = 300e9
    assert refused(data) == "model.active_parameters.value"


def test_a_model_the_cell_cannot_hold_with_one_context_is_refused() -> None:
    data = raw()
    data["cell"]["accelerators"]["value"] = 6  # 6 x 80 GB x 0.9 = 432 GB < 470 GB of weights
    assert refused(data) == "cell.accelerators.value"


def test_an_unknown_field_and_a_missing_label_are_refused() -> None:
    data = raw()
    data["engine"]["max_num_seq"] = {"value": 1, "source": "typo"}
    assert refused(data) == "engine.max_num_seq"
    data = raw()
    data["label"] = "real"
    assert refused(data) == "label"


def test_a_cell_count_the_machine_cannot_hold_is_refused_naming_cells() -> None:
    profile = load_profile(PROFILES[0])
    per_cell = int(profile["emulator.bytes_per_cell"])
    check_cells(profile, 256, available_bytes=256 * per_cell)
    with pytest.raises(InvalidArgument) as err:
        check_cells(profile, 256, available_bytes=255 * per_cell)
    assert err.value.field == "cells"
    with pytest.raises(InvalidArgument):
        check_cells(profile, 1, available_bytes=2**40)


def test_decode_is_memory_bound_at_small_batches_and_compute_bound_at_large_ones() -> None:
    t = engine_timing(load_profile(PROFILES[0]))
    weights_only = t.weight_bytes / t.memory_bytes_per_s
    assert t.decode_step_s(batch=1, context_tokens=0) == pytest.approx(weights_only)
    # More context costs its KV bytes; a batch past the ridge point costs its FLOPs.
    assert t.decode_step_s(batch=1, context_tokens=100_000) > weights_only
    huge = 100_000
    assert t.decode_step_s(batch=huge, context_tokens=0) == pytest.approx(
        huge * t.flops_per_token / t.decode_flops_per_s
    )


def test_advance_carries_the_fraction_of_a_step_to_the_next_tick() -> None:
    t = engine_timing(load_profile(PROFILES[0]))
    step = t.decode_step_s(batch=1, context_tokens=0)
    steps, carry = advance(t, budget_s=2.5 * step, batch=1, context_tokens=0, carry=0.6)
    assert steps == 3 and carry == pytest.approx(0.1)


def test_the_simulator_takes_its_costs_from_the_same_profile() -> None:
    profile = load_profile(PROFILES[0])
    workload = yaml.safe_load((REPO / "bench" / "workloads" / "paper-ablation-12step.yaml").read_text())
    for section, values in workload_costs(profile).items():
        workload[section].update(values)
    w = parse_workload(workload, base_dir=REPO / "bench" / "workloads")
    assert w.kv_bytes_per_token == engine_timing(profile).kv_bytes_per_token
    assert w.tokens_per_s_per_cell == pytest.approx(profile.training_tokens_per_s_per_cell)
    assert w.replica_bytes == profile.weight_bytes
