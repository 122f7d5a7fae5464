"""`gyre evaluate --task TASK (--workspace DIR | --patch FILE) --json`: grade offline (shell).

`--workspace` grades a folder for Gyre's own families; `--patch` grades a diff against the base
of a container task (`swebench`, `harbor`) in a fresh container of the task's image, exactly as
the evaluator grades an agent's diff. Prints {"score", "assessable", "details"}; exit code 0
when a grade was produced (even `assessable: false`), 2 for bad input (unknown task, malformed
task.toml, no such folder or patch, the task's image not present, naming the field).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from gyre.errors import GyreError, InvalidArgument
from gyre.logs import configure_logging
from gyre.sandbox.host import SandboxHost
from gyre.sandbox.oci import OciBackend
from gyre.settings import KernelSettings
from services.evaluator.config import EvaluatorSettings
from services.evaluator.container_task import (
    CONTAINER_FAMILIES,
    ContainerTask,
    load_container_task,
    read_family,
)
from services.evaluator.grading import Graded, Grader
from services.evaluator.taskset import TaskDef, load_task


async def grade_patch(ref: str, patch: Path, *, settings: EvaluatorSettings, partial: bool) -> dict[str, Any]:
    """Grade a diff for a container task; bad input (no such patch, image missing) raises."""
    folder = Path(ref)
    if read_family(folder) not in CONTAINER_FAMILIES:
        raise InvalidArgument(
            "task", f"--patch grades container tasks ({', '.join(CONTAINER_FAMILIES)}); {ref!r} is not one"
        )
    task = load_container_task(folder)
    try:
        diff = await asyncio.to_thread(patch.read_bytes)
    except OSError as exc:
        raise InvalidArgument("patch", f"{str(patch)!r} cannot be read: {exc}") from exc
    backend = OciBackend()
    await backend.require_image(task.image, at=f"{folder / 'task.toml'}: environment.image")
    graded = await settings.container_grader(backend).grade(task, diff)
    return report(task, graded, partial=partial)


def report(task: TaskDef | ContainerTask, graded: Graded, *, partial: bool) -> dict[str, Any]:
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
            "signals": list(graded.signals),
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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--workspace", help="the folder to grade (it is copied, never changed)")
    source.add_argument("--patch", help="container tasks: a diff against the task's base commit to grade")
    parser.add_argument(
        "--partial", action="store_true", help="the execution timed out: report partial credit"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    ns = parser.parse_args(argv)
    settings = EvaluatorSettings()

    async def grade() -> dict[str, Any]:
        if ns.patch is not None:
            return await grade_patch(ns.task, Path(ns.patch), settings=settings, partial=ns.partial)
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
