"""SWE-bench-family rows (SWE-bench, SWE-Gym, SWE-smith) into task folders (pure).

A row names its repository, base commit, problem statement, gold `patch`, `test_patch` and the
FAIL_TO_PASS / PASS_TO_PASS test ids (lists, or JSON strings of lists). What each dataset leaves
implicit is filled in the way its own harness does:

- the image: an explicit `image_name` / `docker_image`, else the dataset's naming rule
  (`swebench/sweb.eval.x86_64.<id, "__" -> "_1776_">:latest`; SWE-Gym
  `xingyaoww/sweb.eval.x86_64.<id, "__" -> "_s_">:latest`; SWE-smith
  `jyangballin/swesmith.x86_64.<owner>_1776_<repo>.<commit8>:latest`);
- the test command and log parser: an explicit `test_command` / `log_parser`, else the runner
  SWE-bench's harness uses for the repository, run on the test files the ids name (pytest ids
  carry their file) or, for runners whose ids do not (Django, sympy), on the files the
  `test_patch` changes;
- SWE-smith: each instance is a branch named by its id in the image's repository, the row's
  `patch` introduced the bug (its reverse is the gold patch) and there is no test patch.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from services.evaluator.imports.imported import (
    DEFAULT_GRADER_TIMEOUT_S,
    ImportedTask,
    Refusal,
    environment_table,
    task_name,
)
from services.evaluator.imports.patches import diff_files, reverse_patch
from services.evaluator.imports.row_fields import RowError, optional_text, test_ids, text
from services.evaluator.test_logs import PARSERS

FLAVOURS = ("swebench", "swegym", "swesmith")
WORKDIR = "/testbed"
# The images of all three datasets keep the repository's dependencies in a conda env "testbed";
# a login shell does not activate it, and images built without conda skip the line.
CONDA = "if [ -f /opt/miniconda3/bin/activate ]; then . /opt/miniconda3/bin/activate testbed; fi; "
# SWE-Gym's repositories (its images and rows follow SWE-bench's form).
SWE_GYM_REPOS = frozenset(
    {
        "getmoto/moto",
        "pandas-dev/pandas",
        "python/mypy",
        "dask/dask",
        "iterative/dvc",
        "conan-io/conan",
        "pydantic/pydantic",
        "facebookresearch/hydra",
        "bokeh/bokeh",
        "modin-project/modin",
        "project-monai/monai",
    }
)
# repo -> (log parser, test runner) as SWE-bench's harness runs them; pytest -rA otherwise.
RUNNERS: Mapping[str, tuple[str, str]] = {
    "django/django": ("django", "./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1"),
    "sympy/sympy": (
        "sympy",
        "PYTHONWARNINGS='ignore::UserWarning,ignore::SyntaxWarning' bin/test -C --verbose",
    ),
    "astropy/astropy": ("pytest", "pytest -rA -vv -o console_output_style=classic --tb=no"),
    "sphinx-doc/sphinx": ("pytest", "tox --current-env -epy39 -v --"),
    "matplotlib/matplotlib": ("matplotlib", "pytest -rA"),
    "mwaskom/seaborn": ("pytest", "pytest --no-header -rA"),
    "psf/requests": ("pytest_options", "pytest -rA"),
    "pylint-dev/pylint": ("pytest_options", "pytest -rA"),
    "pydicom/pydicom": ("pytest_options", "pytest -rA"),
}
DEFAULT_RUNNER = ("pytest", "pytest -rA")
_SMITH_ID = re.compile(r"^[\w.-]+__[\w.-]+\.[0-9a-f]{8}\.\S+$")


def flavour_of(row: Mapping[str, Any]) -> str:
    """Which dataset a SWE-bench-form row comes from, by its repository, image or id.

    Example: {"repo": "swesmith/pallets__flask.bc098406", ...} -> "swesmith";
    {"repo": "getmoto/moto", ...} -> "swegym"; {"repo": "astropy/astropy", ...} -> "swebench"
    """
    repo = str(row.get("repo", ""))
    image = str(row.get("image_name", "") or "")
    if (
        repo.startswith("swesmith/")
        or "swesmith" in image
        or _SMITH_ID.match(str(row.get("instance_id", "")))
    ):
        return "swesmith"
    if repo.lower() in SWE_GYM_REPOS:
        return "swegym"
    return "swebench"


def image_for(flavour: str, instance_id: str, row: Mapping[str, Any]) -> str:
    """The instance's OCI image: the row's own, else the dataset's naming rule.

    Example:
        ("swebench", "astropy__astropy-12907")
            -> "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
        ("swegym", "getmoto__moto-6920")       -> "xingyaoww/sweb.eval.x86_64.getmoto_s_moto-6920:latest"
        ("swesmith", "pallets__flask.bc098406.func_basic__x1")
            -> "jyangballin/swesmith.x86_64.pallets_1776_flask.bc098406:latest"
    """
    explicit = optional_text(row, "docker_image", "image_name")
    if flavour == "swesmith":
        if explicit and "/" in explicit:
            return explicit
        base = explicit or "swesmith.x86_64." + instance_id.rsplit(".", 1)[0]
        return f"jyangballin/{base.replace('__', '_1776_').lower()}:latest"
    if explicit:
        return explicit
    if "__" not in instance_id:
        raise RowError("image_name", "no image given and the id is not owner__repo-N: name the image")
    if flavour == "swegym":
        return f"xingyaoww/sweb.eval.x86_64.{instance_id.replace('__', '_s_').lower()}:latest"
    return f"swebench/sweb.eval.x86_64.{instance_id.lower().replace('__', '_1776_')}:latest"


def _directives(repo: str, parser: str, ids: list[str], test_patch: str) -> list[str]:
    """What to pass the runner: Django test labels, or test files."""
    if parser == "django":
        return [
            f.removeprefix("tests/").removesuffix(".py").replace("/", ".")
            for f in diff_files(test_patch)
            if f.startswith("tests/") and f.endswith(".py")
        ]
    if ids and all("::" in t for t in ids):
        files: list[str] = []
        for t in ids:
            f = t.split("::", 1)[0]
            if f not in files:
                files.append(f)
        return files
    return diff_files(test_patch)


def test_command(repo: str, parser: str, runner: str, ids: list[str], test_patch: str) -> str:
    """The default command: activate the image's env, run only the tests the row names.

    Example:
        ("pallets/flask", "pytest", "pytest -rA", ["tests/test_a.py::test_x"], "")
        -> CONDA + "pytest -rA tests/test_a.py"
    """
    directives = _directives(repo, parser, ids, test_patch)
    if not directives:
        raise RowError(
            "test_command",
            "no test files in the test ids or the test_patch to run: give test_command",
        )
    return CONDA + runner + " " + " ".join(shlex.quote(d) for d in directives)


def import_swebench_row(row: Mapping[str, Any], *, flavour: str | None = None) -> ImportedTask | Refusal:
    """One row into a task, or a refusal naming the instance and the field at fault."""
    raw_id = row.get("instance_id")
    instance_id = raw_id if isinstance(raw_id, str) and raw_id.strip() else "?"
    try:
        instance_id = text(row, "instance_id")
        return _task(row, instance_id, flavour or flavour_of(row))
    except RowError as err:
        return Refusal(id=instance_id, field=err.field, why=err.why)


def _task(row: Mapping[str, Any], instance_id: str, flavour: str) -> ImportedTask:
    if flavour not in FLAVOURS:
        raise RowError("format", f"must be one of {', '.join(FLAVOURS)}, got {flavour!r}")
    smith = flavour == "swesmith"
    repo = text(row, "repo")
    base_commit = instance_id if smith else text(row, "base_commit")
    prompt = text(row, "problem_statement")
    patch = text(row, "patch")
    test_patch = optional_text(row, "test_patch") if smith else text(row, "test_patch")
    fail_to_pass = test_ids(row, "FAIL_TO_PASS")
    pass_to_pass = test_ids(row, "PASS_TO_PASS")
    if not fail_to_pass:
        raise RowError("FAIL_TO_PASS", "names no test: nothing would tell a fix from no change")
    parser, runner = RUNNERS.get(repo.lower(), DEFAULT_RUNNER)
    parser = optional_text(row, "log_parser") or parser
    if parser not in PARSERS:
        raise RowError("log_parser", f"unknown parser {parser!r}: expected one of {', '.join(PARSERS)}")
    command = optional_text(row, "test_command", "test_cmd") or test_command(
        repo, parser, runner, fail_to_pass + pass_to_pass, test_patch
    )
    source: dict[str, Any] = {"format": flavour, "id": instance_id, "repo": repo, "base_commit": base_commit}
    version = row.get("version")
    if isinstance(version, str | int | float) and not isinstance(version, bool) and str(version):
        source["version"] = str(version)
    setup_commit = optional_text(row, "environment_setup_commit")
    if setup_commit:
        source["environment_setup_commit"] = setup_commit
    return ImportedTask(
        name=task_name(instance_id),
        family="swebench",
        prompt=prompt,
        grader_timeout_s=DEFAULT_GRADER_TIMEOUT_S,
        source=source,
        environment=environment_table(image=image_for(flavour, instance_id, row), workdir=WORKDIR),
        grading=grading_table(command, parser, fail_to_pass, pass_to_pass),
        files={
            "hidden/test.patch": _with_newline(test_patch),
            "hidden/gold.patch": _with_newline(reverse_patch(patch) if smith else patch),
        },
    )


def grading_table(
    command: str, parser: str, fail_to_pass: list[str], pass_to_pass: list[str]
) -> dict[str, Any]:
    """F2P carries 0.7 and P2P 0.3 of the reward; with no P2P tests F2P carries it all."""
    f2p_weight = 0.7 if pass_to_pass else 1.0
    return {
        "test_command": command,
        "log_parser": parser,
        "fail_to_pass": fail_to_pass,
        "pass_to_pass": pass_to_pass,
        "weights": {"fail_to_pass": f2p_weight, "pass_to_pass": round(1.0 - f2p_weight, 6)},
    }


def _with_newline(patch: str) -> str:
    """git apply refuses a patch whose last line lacks its newline."""
    return patch if not patch or patch.endswith("\n") else patch + "\n"
