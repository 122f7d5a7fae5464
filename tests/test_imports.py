"""Importers: dataset rows and Harbor folders into task folders; every problem a named refusal."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from gyre.errors import InvalidArgument
from services.evaluator.imports.harbor_folders import HarborFolder, import_harbor_folder
from services.evaluator.imports.imported import ImportedTask, Refusal, task_name
from services.evaluator.imports.patches import diff_files, reverse_patch
from services.evaluator.imports.r2e_rows import import_r2e_row
from services.evaluator.imports.sources import import_source
from services.evaluator.imports.swebench_rows import CONDA, import_swebench_row
from services.evaluator.imports.toml_text import render
from services.evaluator.imports.writer import dedupe, write_tasks

TEST_PATCH = (
    "diff --git a/tests/test_a.py b/tests/test_a.py\n--- a/tests/test_a.py\n+++ b/tests/test_a.py\n"
    "@@ -1 +1,2 @@\n x = 1\n+y = 2\n"
)
GOLD = "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-bad\n+good\n"


def swebench_row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "instance_id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "problem_statement": "separability_matrix is wrong for nested models",
        "patch": GOLD,
        "test_patch": TEST_PATCH,
        "FAIL_TO_PASS": '["astropy/modeling/tests/test_separable.py::test_nested[cm0]"]',
        "PASS_TO_PASS": [
            "astropy/modeling/tests/test_separable.py::test_a",
            "astropy/modeling/tests/test_core.py::test_b",
        ],
        "version": "4.3",
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def imported(result: ImportedTask | Refusal) -> ImportedTask:
    assert isinstance(result, ImportedTask), result
    return result


def refused(result: ImportedTask | Refusal) -> Refusal:
    assert isinstance(result, Refusal), result
    return result


# --- names ---------------------------------------------------------------------------------------


def test_task_name_keeps_a_plain_id_and_cleans_others() -> None:
    assert task_name("astropy__astropy-12907") == "astropy__astropy-12907"
    assert task_name("Owner/Repo.1fd52536") == "owner-repo-1fd52536"
    assert task_name("123-fix") == "t-123-fix"


def test_task_name_of_long_ids_is_64_and_tells_them_apart() -> None:
    a, b = task_name("x" * 80 + "a"), task_name("x" * 80 + "b")
    assert len(a) == len(b) == 64 and a != b and a[:55] == "x" * 55


# --- SWE-bench family ----------------------------------------------------------------------------


def test_swebench_row_becomes_a_task_with_its_image_tests_and_patches() -> None:
    task = imported(import_swebench_row(swebench_row()))
    assert task.name == "astropy__astropy-12907" and task.family == "swebench"
    assert task.source == {
        "format": "swebench",
        "id": "astropy__astropy-12907",
        "repo": "astropy/astropy",
        "base_commit": "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
        "version": "4.3",
        "environment_setup_commit": "298ccb478e6bf092953bca67a3d29dc6c35f6752",
    }
    assert task.environment["image"] == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
    assert task.environment["workdir"] == "/testbed"
    grading = task.grading
    assert grading["test_command"] == CONDA + (
        "pytest -rA -vv -o console_output_style=classic --tb=no "
        "astropy/modeling/tests/test_separable.py astropy/modeling/tests/test_core.py"
    )
    assert grading["fail_to_pass"] == ["astropy/modeling/tests/test_separable.py::test_nested[cm0]"]
    assert len(grading["pass_to_pass"]) == 2 and grading["weights"] == {
        "fail_to_pass": 0.7,
        "pass_to_pass": 0.3,
    }
    assert task.files == {"hidden/test.patch": TEST_PATCH, "hidden/gold.patch": GOLD}


def test_explicit_image_command_and_parser_win() -> None:
    task = imported(
        import_swebench_row(
            swebench_row(image_name="mine/img:1", test_command="make check", log_parser="unittest")
        )
    )
    assert task.environment["image"] == "mine/img:1"
    assert (task.grading["test_command"], task.grading["log_parser"]) == ("make check", "unittest")


def test_django_rows_run_the_test_labels_of_the_test_patch() -> None:
    patch = "diff --git a/tests/auth_tests/test_views.py b/tests/auth_tests/test_views.py\n"
    row = swebench_row(
        instance_id="django__django-11099",
        repo="django/django",
        test_patch=patch,
        FAIL_TO_PASS=["test_login (auth_tests.test_views.LoginTest)"],
        PASS_TO_PASS=[],
    )
    grading = imported(import_swebench_row(row)).grading
    assert grading["log_parser"] == "django"
    assert grading["test_command"].endswith(
        "runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_views"
    )
    assert grading["weights"] == {"fail_to_pass": 1.0, "pass_to_pass": 0.0}


def test_sympy_rows_run_the_files_of_the_test_patch() -> None:
    patch = "diff --git a/sympy/core/tests/test_basic.py b/sympy/core/tests/test_basic.py\n"
    row = swebench_row(
        instance_id="sympy__sympy-20590",
        repo="sympy/sympy",
        test_patch=patch,
        FAIL_TO_PASS=["test_immutable"],
    )
    grading = imported(import_swebench_row(row)).grading
    assert grading["log_parser"] == "sympy"
    assert grading["test_command"].endswith("bin/test -C --verbose sympy/core/tests/test_basic.py")


def test_swegym_rows_take_swegyms_image_rule() -> None:
    row = swebench_row(instance_id="getmoto__moto-6920", repo="getmoto/moto")
    task = imported(import_swebench_row(row))
    assert task.source["format"] == "swegym"
    assert task.environment["image"] == "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-6920:latest"


def test_swesmith_rows_start_at_their_branch_and_reverse_the_bug_patch() -> None:
    row = swebench_row(
        instance_id="pallets__flask.bc098406.func_basic__abc123",
        repo="swesmith/pallets__flask.bc098406",
        base_commit=None,
        test_patch=None,
        image_name="swesmith.x86_64.pallets__flask.bc098406",
        FAIL_TO_PASS=["tests/test_basic.py::test_x"],
        PASS_TO_PASS=[],
    )
    task = imported(import_swebench_row(row))
    assert task.source["format"] == "swesmith"
    assert task.source["base_commit"] == "pallets__flask.bc098406.func_basic__abc123"
    assert task.environment["image"] == "jyangballin/swesmith.x86_64.pallets_1776_flask.bc098406:latest"
    assert task.files["hidden/test.patch"] == ""
    assert task.files["hidden/gold.patch"] == reverse_patch(GOLD)


def test_swesmith_image_from_the_id_when_the_row_names_none() -> None:
    row = swebench_row(instance_id="oauthlib__oauthlib.1fd52536.combine_file__x", repo="swesmith/x")
    image = imported(import_swebench_row(row)).environment["image"]
    assert image == "jyangballin/swesmith.x86_64.oauthlib_1776_oauthlib.1fd52536:latest"


@pytest.mark.parametrize(
    "missing",
    [
        "instance_id",
        "repo",
        "base_commit",
        "problem_statement",
        "patch",
        "test_patch",
        "FAIL_TO_PASS",
        "PASS_TO_PASS",
    ],
)
def test_a_row_missing_a_field_is_refused_by_name(missing: str) -> None:
    row = swebench_row()
    del row[missing]
    refusal = refused(import_swebench_row(row))
    assert refusal.field == missing and "required" in refusal.why
    assert refusal.id == ("?" if missing == "instance_id" else "astropy__astropy-12907")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS"),
        ({"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS"),
        ({"PASS_TO_PASS": [1, 2]}, "PASS_TO_PASS"),
        ({"problem_statement": "   "}, "problem_statement"),
        ({"base_commit": 12}, "base_commit"),
        ({"log_parser": "nosuch"}, "log_parser"),
        ({"FAIL_TO_PASS": ["test_x"], "PASS_TO_PASS": [], "test_patch": "no diff"}, "test_command"),
        ({"instance_id": "noseparator", "repo": "a/b"}, "image_name"),
    ],
)
def test_a_malformed_row_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    assert refused(import_swebench_row(swebench_row(**changes))).field == field


# --- R2E-Gym -------------------------------------------------------------------------------------


def r2e_row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "repo_name": "aiohttp",
        "docker_image": "namanjain12/aiohttp_final:f0d74880",
        "commit_hash": "f0d74880deec8fcd982bce639c93c5e130d41198",
        "problem_statement": "The join helper drops empty parts",
        "parsed_commit_content": json.dumps(
            {"old_commit_hash": "aaaa1111", "new_commit_hash": "f0d74880", "file_diffs": []}
        ),
        "expected_output_json": json.dumps(
            {"TestJoin.test_empty": "PASSED", "test_b - reason": "PASSED", "test_flaky": "FAILED"}
        ),
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not None}


def test_r2e_row_grades_the_tests_its_reference_passes() -> None:
    task = imported(import_r2e_row(r2e_row()))
    assert task.source == {
        "format": "r2e",
        "id": "aiohttp__f0d74880deec8fcd982bce639c93c5e130d41198",
        "repo": "aiohttp",
        "base_commit": "aaaa1111",
    }
    assert task.environment["image"] == "namanjain12/aiohttp_final:f0d74880"
    assert task.grading["log_parser"] == "r2e"
    assert task.grading["fail_to_pass"] == ["TestJoin.test_empty", "test_b"]
    assert task.grading["pass_to_pass"] == [] and "/root/run_tests.sh" in task.grading["test_command"]
    assert task.files == {"hidden/test.patch": ""}


def test_r2e_row_with_its_old_commit_log_tells_fail_to_pass_from_pass_to_pass() -> None:
    old_log = (
        "PASSED r2e_tests/test_1.py::test_b\n"
        "FAILED r2e_tests/test_1.py::TestJoin::test_empty - assert 1 == 2\n"
        "PASSED r2e_tests/test_1.py::test_flaky\n"
    )
    row = r2e_row(
        execution_result_content=json.dumps({"old_commit_res_stdout": old_log, "new_commit_res_stdout": ""})
    )
    task = imported(import_r2e_row(row))
    assert task.grading["fail_to_pass"] == ["TestJoin.test_empty"]
    assert task.grading["pass_to_pass"] == ["test_b"]  # test_flaky: the reference fails it, dropped


def test_r2e_row_with_an_empty_execution_result_keeps_every_passing_test_to_pass() -> None:
    task = imported(import_r2e_row(r2e_row(execution_result_content="")))
    assert task.grading["fail_to_pass"] == ["TestJoin.test_empty", "test_b"]
    assert task.grading["pass_to_pass"] == []


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"execution_result_content": "not json"}, "execution_result_content"),
        ({"execution_result_content": '{"old_commit_res_stdout": 3}'}, "execution_result_content"),
        ({"docker_image": None}, "docker_image"),
        ({"parsed_commit_content": "{}"}, "parsed_commit_content"),
        ({"expected_output_json": "[1]"}, "expected_output_json"),
        ({"expected_output_json": '{"t": "FAILED"}'}, "expected_output_json"),
        ({"commit_hash": None}, "commit_hash"),
    ],
)
def test_a_malformed_r2e_row_is_refused_naming_the_field(changes: dict[str, Any], field: str) -> None:
    assert refused(import_r2e_row(r2e_row(**changes))).field == field


# --- Harbor --------------------------------------------------------------------------------------


def harbor(**changes: Any) -> HarborFolder:
    fields: dict[str, Any] = {
        "name": "fix-git",
        "root": "/data/fix-git",
        "task_toml": '[verifier]\ntimeout_sec = 90.0\n[environment]\ncpus = 2\nmemory = "2G"\n',
        "instruction": "Repair the repository in /app.",
        "dockerfile": "FROM debian\nWORKDIR /srv\nWORKDIR /app\n",
        "files": (
            "task.toml",
            "instruction.md",
            "environment/Dockerfile",
            "environment/data.csv",
            "tests/test.sh",
            "tests/test_out.py",
            "solution/solve.sh",
        ),
    }
    fields.update(changes)
    return HarborFolder(**fields)


def test_harbor_folder_becomes_a_task_with_hidden_tests() -> None:
    task = imported(import_harbor_folder(harbor()))
    assert (task.name, task.family, task.grader_timeout_s) == ("fix-git", "harbor", 90.0)
    assert task.environment == {
        "image": "localhost/gyre-harbor/fix-git:latest",
        "dockerfile": "environment/Dockerfile",
        "workdir": "/app",
        "cpus": 2.0,
        "memory_mb": 2048,
        "storage_mb": 10240,
    }
    assert task.grading["tests_dir"] == "hidden/tests" and task.grading["timeout_s"] == 90.0
    assert dict(task.copies) == {
        "environment/Dockerfile": "environment/Dockerfile",
        "environment/data.csv": "environment/data.csv",
        "hidden/tests/test.sh": "tests/test.sh",
        "hidden/tests/test_out.py": "tests/test_out.py",
        "hidden/solution/solve.sh": "solution/solve.sh",
    }


def test_harbor_task_with_a_built_image_needs_no_dockerfile() -> None:
    toml = '[task]\nname = "org/fix-git"\n[environment]\ndocker_image = "ghcr.io/x/y:1"\n'
    files = ("task.toml", "instruction.md", "tests/test.sh")
    task = imported(import_harbor_folder(harbor(task_toml=toml, dockerfile=None, files=files)))
    assert task.source["id"] == "org/fix-git" and task.name == "org-fix-git"
    assert task.environment["image"] == "ghcr.io/x/y:1" and task.environment["dockerfile"] == ""
    assert task.grader_timeout_s == 600.0 and task.environment["memory_mb"] == 2048


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"files": ("task.toml", "instruction.md", "environment/Dockerfile")}, "tests"),
        ({"instruction": None}, "instruction.md"),
        ({"task_toml": None}, "task.toml"),
        ({"task_toml": "[verifier\n"}, "task.toml"),
        ({"files": ("task.toml", "tests/test.sh"), "dockerfile": None}, "environment"),
        ({"task_toml": "[verifier]\ntimeout_sec = -1\n"}, "verifier.timeout_sec"),
        ({"task_toml": '[environment]\nmemory = "lots"\n'}, "environment.memory"),
        ({"task_toml": "[environment]\ncpus = true\n"}, "environment.cpus"),
    ],
)
def test_a_broken_harbor_folder_is_refused_naming_the_part(changes: dict[str, Any], field: str) -> None:
    refusal = refused(import_harbor_folder(harbor(**changes)))
    assert (refusal.id, refusal.field) == ("fix-git", field)


# --- patches and task.toml text ------------------------------------------------------------------


def test_diff_files_lists_each_changed_path_once() -> None:
    assert diff_files(TEST_PATCH + GOLD + TEST_PATCH) == ["tests/test_a.py", "a.py"]


def test_reverse_patch_swaps_sides_and_is_its_own_inverse() -> None:
    patch = (
        "diff --git a/n.py b/n.py\nnew file mode 100644\nindex 0000000..e69de29\n--- /dev/null\n"
        "+++ b/n.py\n@@ -0,0 +1,2 @@\n+one\n+two\n\\ No newline at end of file\n"
    )
    back = reverse_patch(patch)
    assert "deleted file mode 100644" in back and "--- a/n.py\n+++ /dev/null" in back
    assert "@@ -1,2 +0,0 @@\n-one\n-two\n\\ No newline at end of file" in back
    assert reverse_patch(back) == patch
    assert (
        reverse_patch(GOLD) == "diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-good\n+bad\n"
    )


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        'say "hi"',
        'ends with "',
        'three """ quotes\nand more',
        "back\\slash\n\ttab",
        "del\x7f nul\x00",
        "ünï 😀\n",
    ],
)
def test_task_toml_reads_back_exactly_what_was_rendered(text: str) -> None:
    doc = {"name": "t", "prompt": text, "grading": {"ids": [text, "b"], "weights": {"a": 0.7}}}
    assert tomllib.loads(render(doc)) == doc


# --- sources and writer (files) ------------------------------------------------------------------


def test_unknown_format_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text("{}\n")
    with pytest.raises(InvalidArgument) as err:
        import_source(tmp_path / "rows.jsonl", "swe-bench-lite")
    assert err.value.field == "--format" and "swebench" in err.value.problem


def test_rows_that_are_not_objects_are_refused_by_line_and_the_rest_read(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(swebench_row()) + "\nnot json\n[1, 2]\n\n")
    results = import_source(path)
    assert isinstance(results[0], ImportedTask)
    assert [(r.id, r.field) for r in results[1:] if isinstance(r, Refusal)] == [
        ("line 2", "line"),
        ("line 3", "line"),
    ]


def test_a_harbor_folder_holding_a_link_is_refused(tmp_path: Path) -> None:
    task = tmp_path / "leaky"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text("")
    (task / "instruction.md").write_text("do it")
    (task / "tests" / "test.sh").symlink_to("/etc/passwd")
    assert [(r.id, r.field) for r in import_source(tmp_path) if isinstance(r, Refusal)] == [
        ("leaky", "tests/test.sh")
    ]


def test_gyres_own_task_folder_is_not_taken_for_a_harbor_task() -> None:
    bundled = Path(__file__).resolve().parents[1] / "services" / "evaluator" / "tasks" / "slugfix"
    [result] = import_source(bundled)
    assert refused(result).field == "task.toml"


def test_a_second_instance_with_a_taken_name_is_refused() -> None:
    first = imported(import_swebench_row(swebench_row()))
    other = imported(import_swebench_row(swebench_row(instance_id="Astropy__astropy-12907")))
    results = dedupe([first, first, other])
    assert results[0] is first
    assert [(r.id, r.field) for r in results[1:] if isinstance(r, Refusal)] == [
        ("astropy__astropy-12907", "id"),
        ("Astropy__astropy-12907", "id"),
    ]


def test_writer_refuses_a_non_empty_out_and_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("x")
    with pytest.raises(InvalidArgument) as err:
        write_tasks(out, [imported(import_swebench_row(swebench_row()))], source="rows.jsonl")
    assert err.value.field == "--out" and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_writer_leaves_nothing_when_a_copy_fails(tmp_path: Path) -> None:
    good = imported(import_swebench_row(swebench_row()))
    missing = imported(import_harbor_folder(harbor(root=str(tmp_path / "gone"))))
    with pytest.raises(InvalidArgument):
        write_tasks(tmp_path / "out", [good, missing], source="x")
    assert list(tmp_path.iterdir()) == []
