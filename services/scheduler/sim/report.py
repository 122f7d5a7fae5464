"""Figures of one workload's runs, as the JSON `gyre sim --json` prints (pure)."""

from __future__ import annotations

from typing import Any

from services.scheduler.sim.bound import lower_bounds
from services.scheduler.sim.engine import Result
from services.scheduler.sim.modes import ABLATION, best_async, simulate
from services.scheduler.sim.workload import Executions, Workload

# The paper's 12-step ablation (hours), printed only beside our reading of that run.
PAPER_ABLATION_WORKLOAD = "paper-ablation-12step"
PAPER_ABLATION_H = {"async": 25.08, "async_streaming": 25.08 * (1 - 0.116), "gyre": 16.12}
# The paper's 48-step run (hours).
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


def run_modes(w: Workload, x: Executions) -> dict[str, tuple[Result, int | None]]:
    runs: dict[str, tuple[Result, int | None]] = {
        "colocate": (simulate("colocate", w, x), None),
        "async": (simulate("async", w, x), w.async_rollout_cells),
    }
    split, best = best_async(w, x)
    runs["async_best"] = (best, split)
    runs["async_streaming"] = (simulate("async_streaming", w, x), w.async_rollout_cells)
    runs["gyre"] = (simulate("gyre", w, x), None)
    runs["burst"] = (simulate("burst", w, x), None)
    return runs


def compare(w: Workload, x: Executions, runs: dict[str, tuple[Result, int | None]]) -> dict[str, Any]:
    bounds = lower_bounds(w, x)
    bound = max(bounds.values())
    gyre = runs["gyre"][0].wall_s
    return {
        "workload": w.name,
        "cells": w.cells,
        "steps": w.steps,
        "executions": w.total_executions,
        "lower_bound_s": round(bound, 1),
        "lower_bounds_s": {k: round(v, 1) for k, v in bounds.items()},
        "modes": {name: mode_figures(r, rollout_cells=split) for name, (r, split) in runs.items()},
        "gyre_over_lower_bound": round(gyre / bound, 4),
        "speedup_of_gyre": {
            name: round(r.wall_s / gyre, 3) for name, (r, _) in runs.items() if name != "gyre"
        },
        "gyre_is_fastest": all(gyre <= r.wall_s for r, _ in runs.values()),
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
