"""Figures of one workload's runs, as the JSON `gyre sim --json` prints (pure)."""

from __future__ import annotations

from typing import Any

from services.scheduler.sim.bound import cap_admission_bound, lower_bounds
from services.scheduler.sim.modes import ABLATION, FIXED_SPLIT, simulate
from services.scheduler.sim.path_bound import at_cap
from services.scheduler.sim.result import Result
from services.scheduler.sim.sweep import best_splits
from services.scheduler.sim.workload import Executions, Workload

# The paper's 12-step ablation (hours), printed only beside our reading of that run.
PAPER_ABLATION_WORKLOAD = "paper-ablation-12step"
PAPER_ABLATION_H = {"async": 25.08, "async_streaming": 25.08 * (1 - 0.116), "gyre": 16.12}
# The paper's 48-step run (hours), printed only beside our reading of that run.
PAPER_48_STEP_WORKLOAD = "paper-2.4t"
PAPER_48_STEP_H = {"gyre": 75.4, "async": 134.6, "colocate": 91.5}


def mode_figures(result: Result, *, rollout_cells: int | None = None) -> dict[str, Any]:
    stale = result.staleness
    figures: dict[str, Any] = {
        "wall_s": round(result.wall_s, 1),
        "wall_h": round(result.wall_s / 3600, 3),
        **{k: round(v, 4) for k, v in result.shares().items()},
        "staleness_mean": round(sum(stale) / len(stale), 3) if stale else 0.0,
        "staleness_max": max(stale, default=0),
        "num_switches": result.num_switches,
        "migrations": result.migrations,
        "steps": result.steps,
        "executions": result.executions,
        "timeouts": result.timeouts,
    }
    if rollout_cells is not None:
        figures["rollout_cells"] = rollout_cells
    return figures


def run_modes(w: Workload, x: Executions, *, jobs: int = 1) -> dict[str, tuple[Result, int | None]]:
    """Every mode; fixed-split ones at the workload's split and, as `<mode>_best`, at their best
    (the sweeps in `jobs` processes; the figures do not depend on it)."""
    runs: dict[str, tuple[Result, int | None]] = {"colocate": (simulate("colocate", w, x), None)}
    own = {mode: simulate(mode, w, x) for mode in FIXED_SPLIT}
    bests = best_splits(FIXED_SPLIT, w, x, known=own, jobs=jobs)
    for mode in FIXED_SPLIT:
        runs[mode] = (own[mode], w.async_rollout_cells)
        split, best = bests[mode]
        runs[f"{mode}_best"] = (best, split)
    runs["burst"] = (simulate("burst", w, x), None)
    # Burst at its best: elastic burst, or burst on the best fixed split, whichever is faster.
    fixed, elastic = runs.pop("burst_fixed_best"), runs["burst"]
    runs["burst_best"] = min(elastic, fixed, key=lambda run: run[0].wall_s)
    runs["gyre"] = (simulate("gyre", w, x), None)
    return runs


def compare(w: Workload, x: Executions, runs: dict[str, tuple[Result, int | None]]) -> dict[str, Any]:
    bounds = lower_bounds(w, x)
    binding = max(bounds, key=lambda k: bounds[k])
    bound = bounds[binding]
    gyre = runs["gyre"][0].wall_s
    # The bound of the policies that admit as the staleness cap allows (the sound bound holds for
    # them too); `modes_admitting_at_cap` says which runs did.
    cap = at_cap(steps=w.steps, groups_per_step=w.groups_per_step, max_staleness=w.max_staleness)
    cap_bound = max(bound, cap_admission_bound(w, x))
    at_cap_modes = sorted(name for name, (r, _) in runs.items() if r.admitted_by_version == cap)
    baselines = {name: r.wall_s for name, (r, _) in runs.items() if name != "gyre"}
    best_baseline = min(baselines, key=lambda k: baselines[k])
    return {
        "workload": w.name,
        "cells": w.cells,
        "steps": w.steps,
        "executions": w.total_executions,
        "lower_bound_s": round(bound, 1),
        "binding_term": binding,
        "lower_bounds_s": {k: round(v, 1) for k, v in bounds.items()},
        "modes": {name: mode_figures(r, rollout_cells=split) for name, (r, split) in runs.items()},
        "gyre_over_bound": round(gyre / bound, 4),
        "cap_admission_bound_s": round(cap_bound, 1),
        "modes_admitting_at_cap": at_cap_modes,
        "gyre_over_cap_admission_bound": round(gyre / cap_bound, 4),
        "best_baseline": best_baseline,
        "gyre_speedup_over_best_baseline": round(baselines[best_baseline] / gyre, 4),
        "speedup_of_gyre": {name: round(wall / gyre, 3) for name, wall in baselines.items()},
        "gyre_is_fastest": all(gyre <= wall for wall in baselines.values()),
        "paper_h": PAPER_48_STEP_H if w.name == PAPER_48_STEP_WORKLOAD else None,
    }


def ablation(w: Workload, x: Executions) -> dict[str, Any]:
    walls = {name: simulate(name, w, x).wall_s for name in ABLATION}
    vanilla = walls["async"]
    paper = PAPER_ABLATION_H if w.name == PAPER_ABLATION_WORKLOAD else {}
    return {
        "workload": w.name,
        "variants": {
            name: {
                "wall_h": round(wall / 3600, 2),
                "vs_vanilla_async_pct": round(100 * (wall / vanilla - 1), 1),
                "paper_h": round(paper[name], 2) if name in paper else None,
            }
            for name, wall in walls.items()
        },
    }
