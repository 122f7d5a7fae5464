"""`gyre evaluate --task TASK --workspace DIR --json`: grade one workspace offline (shell).

Prints {"score", "assessable", "details"}; exit code 0 when a grade was produced (even
`assessable: false`), 2 for bad input (unknown task, malformed task.toml, no such folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gyre.errors import GyreError
from gyre.logs import configure_logging
from gyre.sandbox.host import SandboxHost
from gyre.settings import KernelSettings
from services.evaluator.config import EvaluatorSettings
from services.evaluator.grading import Graded, Grader
from services.evaluator.taskset import TaskDef, load_task


def report(task: TaskDef, graded: Graded, *, partial: bool) -> dict[str, Any]:
    s = graded.scored
    return {
        "score": s.score,
        "assessable": s.assessable,
        "details": {
            "task": task.name,
            "family": task.family,
            "grader": graded.grader,
            "partial": partial,
            "reason": s.reason,
            "checks": [
                {
                    "name": c.name,
                    "outcome": c.outcome,
                    "weight": c.weight,
                    "score": c.score,
                    "detail": c.detail,
                }
                for c in s.checks
            ],
            "attempts": graded.attempts,
            "duration_s": round(graded.duration_s, 3),
        },
    }


def main(argv: list[str]) -> int:
    kernel = KernelSettings()
    configure_logging(fmt=kernel.log_format, level=kernel.log_level)  # to stderr: stdout is the JSON
    return run(argv)


def run(argv: list[str]) -> int:
    """`main` without configuring logging (tests call this in-process)."""
    parser = argparse.ArgumentParser(
        prog="gyre evaluate", description="Grade one workspace offline, in a sandbox."
    )
    parser.add_argument("--task", required=True, help="bundled task name (e.g. wordfreq) or a task folder")
    parser.add_argument(
        "--workspace", required=True, help="the folder to grade (it is copied, never changed)"
    )
    parser.add_argument(
        "--partial", action="store_true", help="the execution timed out: report partial credit"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    ns = parser.parse_args(argv)
    settings = EvaluatorSettings()

    async def grade() -> dict[str, Any]:
        task = load_task(ns.task, bundled=settings.tasks_dir)
        host = SandboxHost(
            settings.sandbox_root,
            mode=settings.sandbox_mode,
            uid_base=settings.uid_base,
        )
        graded = await Grader(host, settings.limits(), **settings.grader_bounds()).grade(
            task, Path(ns.workspace)
        )
        return report(task, graded, partial=ns.partial)

    try:
        result = asyncio.run(grade())
    except GyreError as exc:
        print(f"gyre evaluate: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(result))
    else:
        print(f"score {result['score']:.3f} assessable {result['assessable']} {result['details']['reason']}")
        for c in result["details"]["checks"]:
            print(f"  {c['name']}: {c['outcome']} {c['score']:.2f} x {c['weight']:.2f}  {c['detail']}")
    return 0
