"""`gyre sim WORKLOAD.yaml [--json] [--plot FILE.png] [--ablation] [--jobs N]` (shell)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any

from gyre.errors import GyreError
from services.scheduler.sim.report import ablation, compare, run_modes
from services.scheduler.sim.workload import draw_executions, load_workload


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gyre sim", description="Simulate the scheduling modes on a workload file, side by side."
    )
    parser.add_argument("workload", help="workload YAML (schema: ../shared/workloads/README.md)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", metavar="FILE.png", help="draw each mode's cell roles over time")
    parser.add_argument("--ablation", action="store_true", help="run the paper's ablation variants instead")
    parser.add_argument(
        "--profile",
        metavar="FILE.yaml",
        help="an emulation profile (bench/profiles/*-emulated.yaml): its costs (training rate, weights, KV, "
        "link, switches) replace the workload's: the costs emulated cells of that profile spend",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=os.cpu_count() or 1,
        help="processes for the best-split sweeps (default: one per CPU; the figures do not depend on it)",
    )
    return parser


def _jobs(text: str) -> int:
    try:
        jobs = int(text)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"--jobs must be a whole number of processes >= 1, got {text!r}")
    return jobs


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['workload']}: {report['cells']} cells, {report['steps']} steps, "
        f"{report['executions']} executions; lower bound {report['lower_bound_s'] / 3600:.2f} h"
        f" ({report['binding_term']})",
        f"{'mode':22} {'split':>5} {'wall h':>8} {'vs gyre':>8} {'rollout':>8} {'train':>8} {'idle':>8}"
        f" {'switch':>8} {'sync':>8} {'stale':>6} {'switches':>9}",
    ]
    gyre = report["modes"]["gyre"]["wall_s"]
    for name, m in report["modes"].items():
        split = str(m.get("rollout_cells", "-"))
        lines.append(
            f"{name:22} {split:>5} {m['wall_h']:8.2f} {m['wall_s'] / gyre:8.2f} {m['rollout_busy']:8.3f}"
            f" {m['training_busy']:8.3f} {m['idle']:8.3f} {m['switching']:8.3f} {m['sync']:8.3f}"
            f" {m['staleness_mean']:6.2f} {m['num_switches']:9d}"
        )
    lines.append(
        f"gyre / lower bound = {report['gyre_over_bound']:.3f}; gyre is"
        f" {report['gyre_speedup_over_best_baseline']:.3f}x the best baseline ({report['best_baseline']})"
    )
    lines.append(
        f"bound of policies admitting at the staleness cap {report['cap_admission_bound_s'] / 3600:.2f} h,"
        f" gyre / it = {report['gyre_over_cap_admission_bound']:.3f};"
        f" admitting at the cap: {', '.join(report['modes_admitting_at_cap']) or 'none'}"
    )
    if report["paper_h"]:
        lines.append("the paper's run: " + ", ".join(f"{k} {v:.1f} h" for k, v in report["paper_h"].items()))
    return "\n".join(lines)


def _ablation_table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['workload']} ablation",
        f"{'variant':22} {'wall h':>8} {'vs vanilla':>11} {'paper h':>8}",
    ]
    for name, v in report["variants"].items():
        paper = f"{v['paper_h']:8.2f}" if v["paper_h"] is not None else f"{'-':>8}"
        lines.append(f"{name:22} {v['wall_h']:8.2f} {v['vs_vanilla_async_pct']:10.1f}% {paper}")
    return "\n".join(lines)


ProfileCosts = Callable[[str], Mapping[str, Mapping[str, float]]]
"""Reads an emulation profile into workload costs; the `gyre` command supplies it (profiles are
the application's, and this service imports no other)."""


def main(argv: list[str], profile_costs: ProfileCosts | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        costs = None
        if ns.profile:
            if profile_costs is None:
                print(
                    "gyre sim: --profile is read by the gyre command (`gyre sim --profile ...`)",
                    file=sys.stderr,
                )
                return 2
            costs = profile_costs(ns.profile)
        workload = load_workload(ns.workload, costs=costs)
    except GyreError as exc:
        print(f"gyre sim: {exc}", file=sys.stderr)
        return 2
    executions = draw_executions(workload)
    if ns.ablation:
        report = ablation(workload, executions)
        print(json.dumps(report) if ns.json else _ablation_table(report))
        return 0
    runs = run_modes(workload, executions, jobs=ns.jobs)
    report = compare(workload, executions, runs)
    if ns.plot:
        from services.scheduler.sim.plot import plot_timelines

        plot_timelines({n: r for n, (r, _) in runs.items()}, ns.plot, title=workload.name)
    print(json.dumps(report) if ns.json else _table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
