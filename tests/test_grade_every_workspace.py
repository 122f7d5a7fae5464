"""Every workspace gets a grade (issue 16, cases 6 and 7): a workspace that is too deep, holds too
many files, or hangs the grader (an endless loop, a file linked to /dev/zero) scores 0 with the
reason, through the real evaluator (`gyre evaluate`, a grading sandbox); it is never a crash and
never `not assessable`, which a policy would learn to prefer over a certain 0."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from bench.escape_paths import deep_chain
from bench.forgery import CORRECT
from gyre.sandbox.trees import remove_tree
from services.evaluator.cli import run as evaluate
from services.evaluator.taskset import BUNDLED


def workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / f"ws-{uuid.uuid4().hex[:6]}"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def quick_task(tmp_path: Path, bundled: str, *, timeout_s: float) -> Path:
    """A copy of a bundled task with a short grader deadline (the bundled ones allow 30-60 s)."""
    folder = tmp_path / f"{bundled}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(BUNDLED / bundled, folder)
    toml = (folder / "task.toml").read_text()
    (folder / "task.toml").write_text(
        "\n".join(
            f"grader_timeout_s = {timeout_s}" if line.startswith("grader_timeout_s") else line
            for line in toml.splitlines()
        )
    )
    return folder


def grade(capsys: pytest.CaptureFixture[str], task: str, ws: Path) -> Any:
    assert evaluate(["--task", task, "--workspace", str(ws), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_correct_solution_scores_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = grade(capsys, "wordfreq", workspace(tmp_path, CORRECT))
    assert result["assessable"] and result["score"] == 1.0, result


def test_a_folder_chain_1100_deep_scores_0_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(tmp_path, CORRECT)
    deep_chain(ws, 1100)
    try:
        result = grade(capsys, "wordfreq", ws)
    finally:
        remove_tree(ws)  # pytest's own clean-up of tmp_path recurses past Python's limit
    assert result["assessable"] is True and result["score"] == 0.0, result
    assert "deeper than" in result["details"]["reason"]


def test_too_many_files_score_0_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GYRE_EVALUATOR_COPY_MAX_FILES", "500")
    ws = workspace(tmp_path, CORRECT)
    (ws / "junk").mkdir()
    for i in range(600):
        (ws / "junk" / str(i)).touch()
    result = grade(capsys, "wordfreq", ws)
    assert result["assessable"] is True and result["score"] == 0.0, result
    assert "more than 500 files" in result["details"]["reason"]


def test_an_endless_loop_at_import_scores_0_not_unassessable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(tmp_path, {**CORRECT, "wordfreq/__init__.py": "while True:\n    pass\n"})
    result = grade(capsys, str(quick_task(tmp_path, "wordfreq", timeout_s=3)), ws)
    assert result["assessable"] is True and result["score"] == 0.0, result
    assert "deadline" in result["details"]["reason"]


def test_a_result_linked_to_dev_zero_scores_0_not_unassessable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ws = workspace(tmp_path, {"names.txt": "ann\nbob"})
    os.symlink("/dev/zero", ws / "total.txt")
    result = grade(capsys, str(quick_task(tmp_path, "csvsum", timeout_s=2)), ws)
    assert result["assessable"] is True and result["score"] == 0.0, result
