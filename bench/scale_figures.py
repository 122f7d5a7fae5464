"""The arithmetic of `bench.scale` (pure): a workload time-scaled for the simulator, the scripted
agent's shapes for the same executions, and the report's comparison figures.

Time-scaling divides every modelled duration by X and multiplies every rate by X, so a run
takes 1/X of the time and keeps its shape: what the emulated cells do with `time_scale=X`.

Example: duration median 60 s, training 24,000 tokens/s, X = 20
    -> duration median 3 s, training 480,000 tokens/s
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import Any

from bench.live_agent import Shape
from gyre.errors import InvalidArgument
from services.scheduler.sim.workload import DEFAULT_GROUP_SETUP_S, DEFAULT_LINK_BYTES_PER_S, DEFAULT_MIGRATE_S

# (section, field, default when the file leaves it out): seconds are divided, rates multiplied.
DURATIONS = (
    ("execution", "timeout_s", None),
    ("rollout", "migrate_s", DEFAULT_MIGRATE_S),
    ("training", "step_overhead_s", None),
    ("training", "group_setup_s", DEFAULT_GROUP_SETUP_S),
    ("training", "step_start_s", 0.0),
    ("switch", "rollout_to_training_s", None),
    ("switch", "training_to_rollout_s", None),
)
RATES = (
    ("training", "tokens_per_s_per_cell", None),
    ("switch", "link_bytes_per_s", DEFAULT_LINK_BYTES_PER_S),
)
LIVE_MODES = ("colocate", "async", "burst", "gyre")
"""The modes the live scheduler runs (`async_streaming` exists only in the simulator)."""


def scaled_workload(
    data: Mapping[str, Any],
    *,
    costs: Mapping[str, Mapping[str, float]],
    time_scale: float,
    cells: int | None = None,
) -> dict[str, Any]:
    """The workload `data` with `costs` (a profile's) merged over its own, then time-scaled.

    `cells` replaces the workload's cell count (async's fixed split then follows it: every cell
    but the core rolls out, as the live scheduler's async does)."""
    if not time_scale > 0 or not math.isfinite(time_scale):
        raise InvalidArgument("time_scale", f"must be a positive number, got {time_scale!r}")
    out = copy.deepcopy(dict(data))
    for section, values in costs.items():
        out[section] = {**out.get(section, {}), **values}
    duration = out["execution"]["duration_s"]
    if duration.get("dist") == "lognormal":
        duration["median"] = duration["median"] / time_scale
    elif duration.get("dist") == "const":
        duration["value"] = duration["value"] / time_scale
    else:
        raise InvalidArgument(
            "execution.duration_s.dist",
            f"bench.scale scales lognormal or const only, got {duration.get('dist')!r}",
        )
    for section, name, default in DURATIONS:
        value = out.get(section, {}).get(name, default)
        if value is not None:
            out.setdefault(section, {})[name] = value / time_scale
    for section, name, default in RATES:
        value = out.get(section, {}).get(name, default)
        if value is not None:
            out.setdefault(section, {})[name] = value * time_scale
    if cells is not None:
        out["cells"] = cells
        out["async_rollout_cells"] = cells - 1
    out["name"] = f"{out.get('name', 'workload')}-x{time_scale:g}"
    return out


def shapes(durations_s: Sequence[float], *, outputs: tuple[int, ...]) -> tuple[Shape, ...]:
    """The scripted agent's executions for drawn (already scaled) durations, in order: the
    calls' `outputs`, and the execution's duration as the tool time between them (the modelled
    decoding of a few tokens is small beside it)."""
    gaps = max(1, len(outputs) - 1)
    return tuple(Shape(outputs=outputs, tool_s=d / gaps) for d in durations_s)


def rel_err(sim: float | None, live: float | None) -> float | None:
    """|sim - live| / live; None when either is missing."""
    if sim is None or live is None or not live > 0 or math.isnan(sim) or math.isnan(live):
        return None
    return abs(sim - live) / live


def compare_modes(live: Mapping[str, float | None], sim: Mapping[str, float]) -> dict[str, Any]:
    """Per mode `wall_s` (live; None where the mode was not run live), `sim_wall_s`, `rel_err`;
    `gyre_fastest` and `gyre_speedup_over_best_baseline` over the modes run live;
    `max_sim_rel_err` over the modes with both figures."""
    modes: dict[str, dict[str, float | None]] = {}
    for mode in dict.fromkeys([*live, *sim]):
        wall, sim_wall = live.get(mode), sim.get(mode)
        modes[mode] = {"wall_s": wall, "sim_wall_s": sim_wall, "rel_err": rel_err(sim_wall, wall)}
    ran = {m: w for m, w in live.items() if w is not None and not math.isnan(w)}
    baselines = {m: w for m, w in ran.items() if m != "gyre"}
    best = min(baselines, key=baselines.__getitem__) if baselines else None
    errors = [e for m in modes.values() if (e := m["rel_err"]) is not None]
    return {
        "modes": modes,
        "gyre_fastest": "gyre" in ran and min(ran, key=ran.__getitem__) == "gyre",
        "best_baseline": best,
        "gyre_speedup_over_best_baseline": (
            baselines[best] / ran["gyre"] if best is not None and "gyre" in ran else None
        ),
        "max_sim_rel_err": max(errors) if errors else None,
    }


def quantile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile `q` of `values`; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
