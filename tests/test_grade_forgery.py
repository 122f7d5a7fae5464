"""A workspace cannot forge its grade: conftest, site hooks, ini files, a rewritten report or
hidden tests, pytest patched in memory. Each forgery is first shown to work on a plain pytest
run, then graded by the evaluator, where it must earn no more than the wrong code it hides."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.forgery import BASELINE, FORGERIES, WRONG, forged_workspace
from services.evaluator.cli import run as evaluate
from services.evaluator.integrity import judge_records
from services.evaluator.scoring import FAILED, PASSED, GraderRun, parse_verdicts, score_task
from services.evaluator.taskset import BUNDLED, parse_task

HIDDEN = BUNDLED / "wordfreq" / "hidden"


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def grade(tmp_path: Path, files: dict[str, str], capsys: pytest.CaptureFixture[str]) -> Any:
    ws = write(tmp_path / f"ws-{uuid.uuid4().hex[:6]}", files)
    assert evaluate(["--task", "wordfreq", "--workspace", str(ws), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "name", ["conftest_pass_all", "sitecustomize_plugin", "ini_plugin", "monkeypatch_pytest"]
)
def test_the_forgeries_fool_a_plain_pytest_run(tmp_path: Path, name: str) -> None:
    ws = write(tmp_path, forged_workspace(name))
    (ws / "gyre_hidden").mkdir(exist_ok=True)
    for f in ("test_tokenize.py", "test_count.py"):
        shutil.copyfile(HIDDEN / f, ws / "gyre_hidden" / f)
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "gyre_hidden"],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(ws)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 0, plain.stdout[-500:]  # every wrong test "passed"


def test_wrong_code_earns_the_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = grade(tmp_path, WRONG, capsys)
    assert result["assessable"] and result["score"] == pytest.approx(BASELINE)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forgery_earns_no_more_than_the_wrong_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    result = grade(tmp_path, forged_workspace(name), capsys)
    assert result["score"] <= BASELINE, result
    if name in ("overwrite_report", "monkeypatch_pytest"):  # caught in the act, not just ignored
        assert result["score"] == 0.0 and "integrity" in result["details"]["reason"], result


FILES = {"test_a.py": "hidden/test_a.py"}
CANARY = {"test_a.py": "test_c1"}


def rec(nodeid: str, when: str, outcome: str) -> str:
    return json.dumps({"kind": "test", "nodeid": nodeid, "when": when, "outcome": outcome})


def honest(call: str = "passed", canary: str = "failed") -> list[str]:
    return [
        rec("test_a.py::test_x", "setup", "passed"),
        rec("test_a.py::test_x", "call", call),
        rec("test_a.py::test_x", "teardown", "passed"),
        rec("test_a.py::test_c1", "setup", "passed"),
        rec("test_a.py::test_c1", "call", canary),
        rec("test_a.py::test_c1", "teardown", "passed"),
        json.dumps({"kind": "end", "exitstatus": 1}),
    ]


def test_judging_the_report() -> None:
    assert judge_records(honest(), files=FILES, canaries=CANARY).outcomes == {"hidden/test_a.py": [PASSED]}
    assert judge_records(honest("failed"), files=FILES, canaries=CANARY).outcomes == {
        "hidden/test_a.py": [FAILED]
    }
    forged = {
        "the canary passed": honest(canary="passed"),
        "a phase twice": [rec("test_a.py::test_x", "call", "passed"), *honest("failed")],
        "a test that is not hidden": [rec("mine.py::test_y", "call", "passed"), *honest()],
        "a line after the end": [*honest(), rec("test_a.py::test_x", "call", "passed")],
        "garbage": ["PASSED", *honest()],
    }
    for why, lines in forged.items():
        run = judge_records(lines, files=FILES, canaries=CANARY)
        assert run.tampered and not run.outcomes, why
    cut = judge_records(honest()[:3], files=FILES, canaries=CANARY)  # pytest died mid-run
    assert cut.error and not cut.tampered
    collect = judge_records(
        [json.dumps({"kind": "collect", "nodeid": "test_a.py", "outcome": "failed"}), honest()[-1]],
        files=FILES,
        canaries=CANARY,
    )
    assert collect.outcomes == {"hidden/test_a.py": ["errored"]}


def test_a_terminal_task_counts_only_the_verdicts_it_declares() -> None:
    task = parse_task(
        {"name": "t", "family": "terminal", "prompt": "p", "requires": ["a"], "check": "hidden/c.sh",
         "verdicts": ["total", "names"]},
        folder=Path("/tasks/t"),
    )  # fmt: skip
    printed = parse_verdicts("FAIL total\nPASS total\nPASS bonus1\nPASS bonus2\nPASS bonus3\n")
    scored = score_task(task, GraderRun(outcomes=printed))
    assert scored.score == 0.0  # total failed once, names never printed, bonus lines ignored
    assert [c.name for c in scored.checks] == ["total", "names"]
