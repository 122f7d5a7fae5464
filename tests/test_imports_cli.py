"""`gyre tasks import` end to end, and the dataset fixtures graded by their own tests.

The fixtures' repositories are built with real git (`repos/commit_base.sh`), their patches
applied with `git apply`, and each row's imported test command run and parsed as the container
grader does, on the host's Python: the gold patch resolves, no change fails FAIL_TO_PASS and
passes PASS_TO_PASS, the wrong patch earns part.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from services.evaluator.imports.imported import ImportedTask
from services.evaluator.imports.patches import reverse_patch
from services.evaluator.imports.r2e_rows import import_r2e_row
from services.evaluator.imports.swebench_rows import import_swebench_row
from services.evaluator.test_logs import TestStatus, parse_test_log

DATA = Path(__file__).resolve().parent / "data" / "datasets"
SWEBENCH_ROWS = [json.loads(line) for line in (DATA / "swebench.jsonl").read_text().splitlines()]
R2E_ROWS = [json.loads(line) for line in (DATA / "r2e.jsonl").read_text().splitlines()]
GYRE = [sys.executable, "-m", "gyre_app.cli"]


def gyre(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*GYRE, *args], capture_output=True, text=True, timeout=120, check=False)


def test_import_writes_every_good_row_and_names_the_refused(tmp_path: Path) -> None:
    rows = (DATA / "swebench.jsonl").read_text().splitlines()
    bad = json.loads(rows[0]) | {"instance_id": "broken__row-1"}
    del bad["test_patch"]
    source = tmp_path / "rows.jsonl"
    source.write_text("\n".join([*rows, json.dumps(bad), rows[1]]) + "\n")
    done = gyre("tasks", "import", str(source), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["imported"] == 5
    assert report["refused"] == [
        {"id": "broken__row-1", "field": "test_patch", "why": "is required"},
        {
            "id": "gyre-fixtures__slugger-1",
            "field": "id",
            "why": "is a duplicate of 'gyre-fixtures__slugger-1'",
        },
    ]
    manifest = json.loads((tmp_path / "out" / "taskset.json").read_text())
    assert manifest["splits"]["train"] == [
        f"gyre-fixtures__{r}-1" for r in ("calc", "slugger", "wordstats", "intervals", "roman")
    ]
    assert manifest["families"] == ["swebench"] and manifest["source"] == str(source)
    calc = tmp_path / "out" / "gyre-fixtures__calc-1"
    assert tomllib.loads((calc / "task.toml").read_text())["source"]["id"] == "gyre-fixtures__calc-1"
    assert (calc / "hidden" / "test.patch").read_text() == json.loads(rows[0])["test_patch"]


def test_import_of_harbor_folders_keeps_their_files_and_modes(tmp_path: Path) -> None:
    done = gyre("tasks", "import", str(DATA / "harbor"), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"imported": 3, "refused": []}
    csv = tmp_path / "out" / "csv-total"
    assert (csv / "environment" / "sales.csv").read_bytes() == (
        DATA / "harbor/csv-total/environment/sales.csv"
    ).read_bytes()
    assert os.access(csv / "hidden" / "tests" / "test.sh", os.X_OK)
    assert not (csv / "tests").exists() and not (csv / "solution").exists()  # the agent never sees them


def test_import_with_nothing_to_import_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    source = tmp_path / "rows.jsonl"
    source.write_text('{"instance_id": "a__b-1"}\n')
    done = gyre("tasks", "import", str(source), "--out", str(tmp_path / "out"), "--json")
    assert done.returncode == 2
    assert json.loads(done.stdout.splitlines()[-1])["refused"][0]["field"] == "repo"
    assert not (tmp_path / "out").exists()


def test_import_refuses_an_unknown_format_by_name(tmp_path: Path) -> None:
    done = gyre(
        "tasks", "import", str(DATA / "r2e.jsonl"), "--out", str(tmp_path / "out"), "--format", "lite"
    )
    assert done.returncode == 2 and "--format" in done.stderr and "unknown format 'lite'" in done.stderr
    assert not (tmp_path / "out").exists()


# --- the fixtures graded by their own tests ------------------------------------------------------


def base_repo(repo: str, dest: Path) -> str:
    shutil.copytree(DATA / "repos" / repo, dest)
    done = subprocess.run(
        ["sh", str(DATA / "repos" / "commit_base.sh")], cwd=dest, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def git_apply(repo: Path, patch: str) -> None:
    if patch:
        subprocess.run(["git", "apply", "-"], cwd=repo, input=patch, text=True, check=True)


def run_tests(repo: Path, task: ImportedTask) -> dict[str, TestStatus]:
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    done = subprocess.run(
        ["bash", "-lc", task.grading["test_command"]],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return parse_test_log(task.grading["log_parser"], done.stdout + done.stderr)


def passed(found: dict[str, TestStatus], ids: list[str]) -> list[bool]:
    return [found.get(t) == TestStatus.PASSED for t in ids]


@pytest.mark.parametrize("row", SWEBENCH_ROWS, ids=lambda r: r["instance_id"])
def test_swebench_fixture_resolves_with_gold_and_partly_with_the_wrong_patch(
    row: dict[str, object], tmp_path: Path
) -> None:
    task = import_swebench_row(row)
    assert isinstance(task, ImportedTask)
    f2p, p2p = task.grading["fail_to_pass"], task.grading["pass_to_pass"]
    repo = tmp_path / "testbed"
    assert base_repo(str(row["repo"]).split("/")[1], repo) == row["base_commit"]
    git_apply(repo, task.files["hidden/test.patch"])
    found = run_tests(repo, task)
    assert passed(found, f2p) == [False, False] and all(passed(found, p2p))
    git_apply(repo, str(row["wrong_patch"]))
    found = run_tests(repo, task)
    assert sorted(passed(found, f2p)) == [False, True] and all(passed(found, p2p))
    git_apply(repo, reverse_patch(str(row["wrong_patch"])))  # the reverse undoes it exactly
    git_apply(repo, task.files["hidden/gold.patch"])
    assert all(passed(run_tests(repo, task), f2p + p2p))


@pytest.mark.parametrize("row", R2E_ROWS, ids=lambda r: r["repo_name"])
def test_r2e_fixture_reaches_its_expected_output_with_gold(row: dict[str, object], tmp_path: Path) -> None:
    task = import_r2e_row(row)
    assert isinstance(task, ImportedTask)
    repo = tmp_path / "testbed"
    assert base_repo(str(row["repo_name"]), repo) == task.source["base_commit"]
    shutil.copytree(DATA / "r2e" / str(row["repo_name"]) / "r2e_tests", repo / "r2e_tests")
    plain = task.grading | {"test_command": f"{sys.executable} -m pytest -rA -p no:cacheprovider r2e_tests"}
    before = run_tests(repo, ImportedTask(**{**_fields(task), "grading": plain}))
    # The row's own old-commit log split them: FAIL_TO_PASS fail before the fix, PASS_TO_PASS pass.
    assert task.grading["pass_to_pass"] and not any(passed(before, task.grading["fail_to_pass"]))
    assert all(passed(before, task.grading["pass_to_pass"]))
    git_apply(repo, task.files["hidden/gold.patch"])
    after = run_tests(repo, ImportedTask(**{**_fields(task), "grading": plain}))
    assert {k: str(v) for k, v in after.items()} == json.loads(str(row["expected_output_json"]))


def _fields(task: ImportedTask) -> dict[str, object]:
    return {f: getattr(task, f) for f in ImportedTask.__dataclass_fields__}
