"""Generated task sets: seeded, split, graded by the real evaluator with partial credit, bad input refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from services.evaluator.cli import run as evaluate
from services.evaluator.generate.cli import main as tasks_cli
from services.evaluator.generate.instance import SOLUTION_FILE, parse_solution
from services.evaluator.generate.writer import load_split
from services.runner.agent.tools import Workspace


def generate(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = tasks_cli(["generate", *args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def files_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def grade(capsys: pytest.CaptureFixture[str], task: Path, ws: Path) -> dict[str, Any]:
    assert evaluate(["--task", str(task), "--workspace", str(ws), "--json"]) == 0
    result: dict[str, Any] = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    return result


def test_the_same_seed_writes_the_same_set_and_a_quarter_is_held_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        code, out = generate(
            capsys, "--family", "all", "--count", "8", "--seed", str(seed), "--out", str(tmp_path / name)
        )
        assert code == 0, out
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    assert files_of(tmp_path / "a") != files_of(tmp_path / "c")
    train, heldout = load_split(tmp_path / "a", "train"), load_split(tmp_path / "a", "heldout")
    assert len(train) == 18 and len(heldout) == 6 and not set(train) & set(heldout)
    assert {n.rsplit("-", 1)[0] for n in heldout} == {"repo-gen", "repair", "terminal"}


@pytest.mark.parametrize("family,untouched", [("repo-gen", 0.0), ("repair", 0.3), ("terminal", 0.0)])
def test_the_reference_solution_earns_full_credit_and_the_untouched_workspace_less(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], family: str, untouched: float
) -> None:
    code, out = generate(
        capsys, "--family", family, "--count", "1", "--seed", "3", "--out", str(tmp_path / "set")
    )
    assert code == 0, out
    task = tmp_path / "set" / f"{family}-0000"
    as_given = grade(capsys, task, task / "workspace")
    # Doing nothing is a policy outcome: assessable, scored as earned (never an infrastructure failure).
    assert as_given["assessable"] and as_given["score"] == pytest.approx(untouched)

    ws = tmp_path / "ws"
    shutil.copytree(task / "workspace", ws)
    steps, _ = parse_solution((task / SOLUTION_FILE).read_text())
    tools = Workspace(ws)
    for step in steps:
        tools.dispatch(step.tool, json.dumps(dict(step.arguments)), delegate=lambda t: "")
    solved = grade(capsys, task, ws)
    assert solved["assessable"] and solved["score"] == pytest.approx(1.0), solved


def test_half_a_terminal_answer_earns_half(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = generate(capsys, "--family", "terminal", "--count", "1", "--out", str(tmp_path / "set"))
    assert code == 0, out
    task = tmp_path / "set" / "terminal-0000"
    ws = tmp_path / "ws"
    shutil.copytree(task / "workspace", ws)
    Workspace(ws).shell("awk 'END{print NR-1}' data.csv > rows.txt")
    assert grade(capsys, task, ws)["score"] == pytest.approx(0.5)


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--family", "poetry", "--count", "2"], "unknown family poetry"),
        (["--family", "repair", "--count", "-1"], "count: must be a positive number"),
        (["--family", "repair", "--count", "0"], "count: must be a positive number"),
    ],
)
def test_bad_arguments_are_refused_naming_them_and_nothing_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], expected: str
) -> None:
    code, out = generate(capsys, *args, "--out", str(tmp_path / "set"))
    assert code == 2 and expected in out
    assert list(tmp_path.iterdir()) == []


def test_a_folder_that_cannot_be_written_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    (tmp_path / "file").write_text("")
    for out, expected in (
        (tmp_path / "used", "exists and is not an empty folder"),
        (tmp_path / "file" / "set", "does not exist"),
        (Path("/proc/gyre-taskset"), "cannot write in /proc"),
    ):
        code, text = generate(capsys, "--family", "repair", "--count", "1", "--out", str(out))
        assert code == 2 and expected in text, text
    assert files_of(tmp_path) == {"used/keep.txt": b"mine", "file": b""}
