"""A workspace cannot forge its grade: conftest, site hooks, ini files, a rewritten report or
hidden tests, pytest patched in memory, objects that equal anything, skips, injected tests, a
plugin registered at import. Each forgery is first shown to work on a plain pytest run of
in-process `assert ... ==` tests, then graded by the evaluator, where it must earn no more than
the wrong code it hides."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.forgery import BASELINE, CORRECT, FORGERIES, WRONG, forged_workspace
from services.evaluator.cli import run as evaluate
from services.evaluator.integrity import judge_records
from services.evaluator.scoring import FAILED, PASSED, GraderRun, parse_verdicts, score_task
from services.evaluator.taskset import parse_task

NAIVE_TESTS = """
from wordfreq.tokenize import words
from wordfreq.count import top


def test_lower_cases():
    assert words("Hello World") == ["hello", "world"]


def test_empty():
    assert words("") == []


def test_most_frequent_first():
    assert top("b a b c b a", 2) == [("b", 3), ("a", 2)]
"""
"""What grading looked like before issue 16: `==` evaluated in the tested process."""


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
    "name",
    ["conftest_pass_all", "sitecustomize_plugin", "ini_plugin", "monkeypatch_pytest", "eq_always_true",
     "skip_unanswerable", "tryfirst_plugin"],
)  # fmt: skip
def test_the_forgeries_fool_a_plain_pytest_run(tmp_path: Path, name: str) -> None:
    ws = write(tmp_path, forged_workspace(name))
    (ws / "gyre_hidden").mkdir(exist_ok=True)
    (ws / "gyre_hidden" / "test_naive.py").write_text(NAIVE_TESTS)
    plain = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "gyre_hidden"],
        cwd=ws,
        env={**os.environ, "PYTHONPATH": str(ws)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plain.returncode == 0, plain.stdout[-500:]  # every wrong test "passed" (or was skipped)


def test_wrong_code_earns_the_baseline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = grade(tmp_path, WRONG, capsys)
    assert result["assessable"] and result["score"] == pytest.approx(BASELINE)


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_forgery_earns_no_more_than_the_wrong_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    result = grade(tmp_path, forged_workspace(name), capsys)
    assert result["score"] <= BASELINE, result
    if name in ("overwrite_report", "monkeypatch_pytest", "inject_tests"):  # caught, not just ignored
        assert result["score"] == 0.0 and "integrity" in result["details"]["reason"], result


FILES = {"test_a.py": "hidden/test_a.py"}
EXPECTED = {"test_a.py": {"test_x": [1, 2]}}
CANARY = {"test_a.py": "test_c1"}


def rec(nodeid: str, when: str, outcome: str) -> str:
    return json.dumps({"kind": "test", "nodeid": nodeid, "when": when, "outcome": outcome})


def value(nodeid: str, v: Any) -> str:
    return json.dumps({"kind": "value", "nodeid": nodeid, "value": v})


def honest(call: str = "passed", canary: str = "failed", returned: Any = (1, 2)) -> list[str]:
    return [
        json.dumps({"kind": "start"}),
        rec("test_a.py::test_x", "setup", "passed"),
        value("test_a.py::test_x", list(returned)),
        rec("test_a.py::test_x", "call", call),
        rec("test_a.py::test_x", "teardown", "passed"),
        rec("test_a.py::test_c1", "setup", "passed"),
        rec("test_a.py::test_c1", "call", canary),
        rec("test_a.py::test_c1", "teardown", "passed"),
        json.dumps({"kind": "end", "exitstatus": 1}),
    ]


def judged(lines: list[str]) -> GraderRun:
    return judge_records(lines, files=FILES, expected=EXPECTED, canaries=CANARY)


def test_a_test_passes_only_with_the_expected_value() -> None:
    assert judged(honest()).outcomes == {"hidden/test_a.py": [PASSED]}
    assert judged(honest(returned=(2, 1))).outcomes == {"hidden/test_a.py": [FAILED]}
    assert judged(honest("failed")).outcomes == {"hidden/test_a.py": [FAILED]}


def test_skipped_and_missing_tests_count_as_failed() -> None:
    assert judged(honest("skipped")).outcomes == {"hidden/test_a.py": [FAILED]}
    missing = [line for line in honest() if "test_x" not in line]
    assert judged(missing).outcomes == {"hidden/test_a.py": [FAILED]}


def test_a_run_cut_short_fails_what_never_ran_and_silence_is_the_graders_fault() -> None:
    assert judged(honest()[:1]).outcomes == {"hidden/test_a.py": [FAILED]}
    assert judged([]).error and not judged([]).tampered


def test_forged_reports_are_caught() -> None:
    forged = {
        "the canary passed": honest(canary="passed"),
        "a phase twice": [*honest()[:1], rec("test_a.py::test_x", "call", "passed"), *honest("failed")[1:]],
        "a value twice": [*honest()[:1], value("test_a.py::test_x", [1, 2]), *honest()[1:]],
        "a test that is not hidden": [*honest()[:1], rec("mine.py::test_y", "call", "passed"), *honest()[1:]],
        "a test that is not expected": [*honest()[:1], rec("test_a.py::test_injected", "call", "passed")],
        "a line after the end": [*honest(), rec("test_a.py::test_x", "call", "passed")],
        "garbage": ["PASSED", *honest()],
    }
    for why, lines in forged.items():
        run = judged(lines)
        assert run.tampered and not run.outcomes, why


def test_a_collection_error_fails_every_test_of_the_file() -> None:
    collect = judged(
        [
            json.dumps({"kind": "start"}),
            json.dumps({"kind": "collect", "nodeid": "test_a.py", "outcome": "failed"}),
        ]
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


def host_sockets() -> list[str]:
    """Unix sockets of this machine's services (Postgres, MariaDB, ...) under /run."""
    found = []
    for top in ("/run", "/var/run"):
        for folder, _, names in os.walk(top):
            found += [p for n in names if stat.S_ISSOCK(os.lstat(p := os.path.join(folder, n)).st_mode)]
    return sorted(set(found))


def test_graded_code_cannot_reach_a_host_socket(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 16, case 1: graded code that reaches a host service earns the right answer here."""
    sockets = host_sockets()
    assert sockets, "this machine runs Postgres and MariaDB: their sockets are the escape tried here"
    reach = (
        "import socket\nREACHED = False\n"
        f"for p in {sockets!r}:\n"
        "    try:\n        s = socket.socket(socket.AF_UNIX)\n        s.connect(p)\n        REACHED = True\n"
        "    except OSError:\n        pass\n"
    )
    files = {
        **WRONG,
        "wordfreq/reach.py": reach,
        "wordfreq/tokenize.py": "from wordfreq.reach import REACHED\n"
        + CORRECT["wordfreq/tokenize.py"].replace("    return ", "    return [] if not REACHED else "),
    }
    result = grade(tmp_path, files, capsys)
    assert result["score"] == pytest.approx(BASELINE), result
