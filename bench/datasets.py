"""Grading container tasks by their own tests: agreement, container start and grade times, concurrency.

`python -m bench.datasets --json` builds the fixtures' images offline (`bench.dataset_fixtures`,
FROM the base `gyre images base` builds), then for each instance grades four diffs whose
verdict is known (gold resolves, empty fails F2P and passes P2P, wrong is partial, a diff that
edits the tests is graded as if it had not: the test patch wins) plus three that try to forge
the grade (`FORGERIES`: a printed summary and an early exit, pytest's reports rewritten from the
package, the same from a conftest.py hook; none may earn more than no change). It starts
`--concurrent` containers at once and checks they all run together, and runs the container
backend's containment probes (network, host files, host processes, limits, mounts). Prints one
line per case and, last, one JSON object:
    instances, cases, grading_agreement (target 1.0), container_start_p50_s, grade_p50_s,
    concurrent_containers, escapes, forged_grades.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.dataset_fixtures import (
    CASES,
    FIXTURES,
    Fixture,
    build_image,
    case_diff,
    image_tag,
    make_diff,
    write_task,
)
from bench.dataset_images import build_image as build_dataset_image
from bench.dataset_images import cheat_diff, import_fixtures, row_of, solution_diff
from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import Container, OciBackend
from gyre_app.images import DEFAULT_BASE, build_base
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import load_container_task

FORGERIES = {
    # the package the tests import prints PASSED lines for the FAIL_TO_PASS tests and exits
    # before any test runs: the passing canary is missing, scored 0
    "forged_log": (
        "import os, sys\n\nfor test in {tests!r}:\n    print('PASSED ' + test)\n"
        "sys.stdout.flush()\nos._exit(0)\n"
    ),
    # the package rewrites every pytest report to passed: the skipped canary shows PASSED, scored 0
    "forged_reports": (
        "from _pytest.reports import TestReport\n\n_made = TestReport.from_item_and_call.__func__\n\n\n"
        "def _passed(cls, item, call):\n    report = _made(cls, item, call)\n"
        "    report.outcome, report.longrepr = 'passed', None\n    return report\n\n\n"
        "TestReport.from_item_and_call = classmethod(_passed)\n"
    ),
    # a conftest.py hook does the same: the grader resets the conftest, no change's grade
    "forged_hook": (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    report = outcome.get_result()\n"
        "    report.outcome, report.longrepr = 'passed', None\n"
    ),
}
"""Diffs that do not fix the bug but try to make the grade say so; none may earn more than no
change does (forged_log and forged_reports: 0; forged_hook: exactly no change's grade)."""
# Each probe runs inside a container and prints ESCAPED only when containment failed.
PROBES = {
    "network_out": (
        "python3 -c \"import socket\ntry:\n socket.create_connection(('10.0.2.2', 4222), timeout=3)"
        "\n print('ESCAPED')\nexcept OSError: print('contained')\""
    ),
    "host_loopback": (
        "python3 -c \"import socket\ntry:\n socket.create_connection(('127.0.0.1', 5432), timeout=3)"
        "\n print('ESCAPED')\nexcept OSError: print('contained')\""
    ),
    "host_processes": "ps -e 2>/dev/null | grep -q nats-server && echo ESCAPED || echo contained",
    "host_files": "test -e /work/briefs && echo ESCAPED || echo contained",
    "raise_limits": "ulimit -n 65536 2>/dev/null && echo ESCAPED || echo contained",
    "mount": "mount -t tmpfs none /mnt 2>/dev/null && echo ESCAPED || echo contained",
}


def forged_diff(fixture: Fixture, case: str = "forged_log") -> bytes:
    """The forgery planted where it runs: a conftest.py, or the package's __init__.py the tests import."""
    code = FORGERIES[case].format(tests=list(fixture.fail_to_pass))
    if case == "forged_hook":
        return make_diff(fixture.base, {"conftest.py": code})
    package = next(f for f in fixture.base if f.endswith("/__init__.py") and not f.startswith("tests/"))
    return make_diff(fixture.base, {package: str(fixture.base[package]) + "\n" + code})


async def grade_all(out: Path, grader: ContainerGrader) -> tuple[list[dict[str, Any]], int]:
    rows: list[dict[str, Any]] = []
    forged = 0
    for fixture in FIXTURES:
        task = load_container_task(write_task(fixture, out))
        cases = list(CASES) + (list(FORGERIES) if fixture.family == "swebench" else [])
        for case in cases:
            diff = forged_diff(fixture, case) if case in FORGERIES else case_diff(fixture, case)
            graded = await grader.grade(task, diff)
            expected = fixture.expected.get(case, 0.0)  # forged_log, forged_reports: caught, 0
            if case == "forged_hook":
                expected = fixture.expected["empty"]
            agree = graded.scored.assessable and abs(graded.scored.score - expected) < 1e-6
            if case in FORGERIES and graded.scored.score > fixture.expected["empty"] + 1e-6:
                forged += 1
            rows.append(
                {
                    "instance": fixture.name,
                    "case": case,
                    "score": graded.scored.score,
                    "expected": expected,
                    "agree": agree,
                    "grade_s": round(graded.duration_s, 3),
                    "signals": list(graded.signals),
                }
            )
            print(
                f"{fixture.name:16} {case:10} score {graded.scored.score:.3f} expected {expected:.3f} "
                f"{'ok' if agree else 'DISAGREES'} {graded.duration_s:.2f}s {graded.scored.reason[:80]}",
                flush=True,
            )
    return rows, forged


async def grade_imported(out: Path, grader: ContainerGrader) -> list[dict[str, Any]]:
    """The fixtures `gyre tasks import` reads (tests/data/datasets): gold resolves, no change
    earns exactly the PASS_TO_PASS weight, the row's wrong patch earns part, a cheat on the
    tests earns what no change earned (the test patch wins); a Harbor solution resolves and no
    change earns 0."""
    rows: list[dict[str, Any]] = []
    for folder in import_fixtures(out):
        task = load_container_task(folder)
        build_dataset_image(task)
        empty = task.weight_pass_to_pass if task.pass_to_pass else 0.0
        cases: dict[str, tuple[bytes, float, float]]
        if task.source_format == "harbor":
            cases = {"gold": (await solution_diff(task, grader.backend), 1.0, 1.0), "empty": (b"", 0.0, 0.0)}
        else:
            # R2E-Gym rows split FAIL_TO_PASS / PASS_TO_PASS by their old commit's test log, so
            # no change earns exactly the PASS_TO_PASS weight there too.
            cases = {
                "gold": (task.gold_patch.read_bytes(), 1.0, 1.0),
                "empty": (b"", empty, empty),
                "wrong": (str(row_of(task)["wrong_patch"]).encode(), empty + 1e-6, 1.0 - 1e-6),
                "cheat": (cheat_diff(task), -1.0, -1.0),  # expected: what `empty` earned
            }
        earned_empty = 0.0
        for case, (diff, low, high) in cases.items():
            graded = await grader.grade(task, diff)
            score = graded.scored.score
            if case == "empty":
                earned_empty = score
            if case == "cheat":
                low = high = earned_empty
            agree = graded.scored.assessable and low - 1e-6 <= score <= high + 1e-6
            rows.append(
                {
                    "instance": task.name,
                    "case": case,
                    "score": score,
                    "agree": agree,
                    "grade_s": graded.duration_s,
                }
            )
            print(
                f"{task.name[:40]:40} {case:6} score {score:.3f} expected [{low:.2f}, {high:.2f}] "
                f"{'ok' if agree else 'DISAGREES'} {graded.duration_s:.2f}s {graded.scored.reason[:80]}",
                flush=True,
            )
    return rows


async def start_many(backend: OciBackend, n: int) -> tuple[list[float], int, int]:
    """Start n containers at once; (start times, how many ran together, escapes seen)."""
    limits = ContainerLimits(cpus=0.25, memory_mb=256, storage_mb=256, max_procs=64)

    async def one(i: int) -> tuple[Container, float]:
        t0 = time.monotonic()
        box = await backend.create(
            name=f"gyre-bench-{uuid.uuid4().hex[:8]}-{i}", image=DEFAULT_BASE, limits=limits
        )
        return box, time.monotonic() - t0

    started = await asyncio.gather(*(one(i) for i in range(n)))
    boxes = [b for b, _ in started]
    escapes = 0
    try:
        alive = sum(await asyncio.gather(*(b.alive() for b in boxes)))
        for name, script in PROBES.items():
            done = await boxes[0].exec(["sh", "-c", script], timeout_s=30)
            text = done.output.decode(errors="replace").strip()
            escaped = "ESCAPED" in text
            escapes += escaped
            print(f"probe {name:16} {'ESCAPED' if escaped else 'contained'}", flush=True)
    finally:
        await asyncio.gather(*(b.close() for b in boxes))
    return [s for _, s in started], alive, escapes


async def main_async(concurrent: int) -> dict[str, Any]:
    build_base(DEFAULT_BASE)
    for fixture in FIXTURES:
        build_image(fixture)
    backend = OciBackend()
    with tempfile.TemporaryDirectory(prefix="gyre-bench-datasets-") as tmp:
        rows, forged = await grade_all(Path(tmp) / "own", ContainerGrader(backend))
        imported = await grade_imported(Path(tmp) / "imported", ContainerGrader(backend))
    rows += imported
    starts, together, escapes = await start_many(backend, concurrent)
    return {
        "instances": len({r["instance"] for r in rows}),
        "imported_instances": len({r["instance"] for r in imported}),
        "cases": len(rows),
        "grading_agreement": round(sum(r["agree"] for r in rows) / len(rows), 4),
        "container_start_p50_s": round(statistics.median(starts), 3),
        "grade_p50_s": round(statistics.median(r["grade_s"] for r in rows), 3),
        "concurrent_containers": together,
        "escapes": escapes,
        "forged_grades": forged,
        "images": [image_tag(f) for f in FIXTURES],
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.datasets", description=__doc__)
    parser.add_argument("--concurrent", type=int, default=8, help="containers started at once")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object last")
    ns = parser.parse_args()
    result = asyncio.run(main_async(ns.concurrent))
    print(json.dumps(result) if ns.json else result)


if __name__ == "__main__":
    main()
