"""Container tasks without a container: task.toml, scoring by test ids, reward files, review signals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gyre.errors import InvalidArgument
from gyre.sandbox.backend import ContainerLimits
from services.evaluator.container_scoring import diff_files, review_signals, score_reward, score_tests
from services.evaluator.container_task import parse_container_task
from services.evaluator.test_logs import TestStatus

DIFF = "diff --git a/pkg/a.py b/pkg/a.py\n--- a/pkg/a.py\n+++ b/pkg/a.py\n"
TEST_DIFF = "diff --git a/tests/test_a.py b/tests/test_a.py\n"


def raw(**over: Any) -> dict[str, Any]:
    task: dict[str, Any] = {
        "name": "pkg-1",
        "family": "swebench",
        "prompt": "fix it",
        "source": {"format": "swebench", "id": "org__pkg-1", "repo": "org/pkg", "base_commit": "abc"},
        "environment": {"image": "img:1", "workdir": "/testbed", "cpus": 2, "memory_mb": 2048},
        "grading": {
            "test_command": "pytest -rA",
            "log_parser": "pytest",
            "fail_to_pass": ["t.py::test_a", "t.py::test_b"],
            "pass_to_pass": ["t.py::test_c"],
        },
    }
    task.update(over)
    return task


def task_of(**over: Any) -> Any:
    return parse_container_task(raw(**over), folder=Path("/tasks/pkg-1"))


def test_a_swebench_task_reads_its_image_limits_and_test_ids() -> None:
    task = task_of()
    assert (task.image, task.workdir, task.source_id) == ("img:1", "/testbed", "org__pkg-1")
    assert task.limits == ContainerLimits(cpus=2.0, memory_mb=2048, storage_mb=10240)
    assert task.fail_to_pass == ("t.py::test_a", "t.py::test_b")
    assert (task.weight_fail_to_pass, task.weight_pass_to_pass) == (0.7, 0.3)


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"environment": {"workdir": "/testbed"}}, "environment.image"),
        ({"environment": {"image": "i", "workdir": "testbed"}}, "environment.workdir"),
        ({"environment": {"image": "i", "memory_mb": 1}}, "environment.memory_mb"),
        ({"family": "docker"}, "family"),
        (
            {"grading": {"test_command": "x", "log_parser": "nose", "fail_to_pass": ["a"]}},
            "grading.log_parser",
        ),
        ({"name": "Bad Name"}, "name"),
        ({"grading": {"log_parser": "pytest", "fail_to_pass": ["a"]}}, "grading.test_command"),
        (
            {
                "grading": {
                    "test_command": "x",
                    "log_parser": "pytest",
                    "fail_to_pass": [],
                    "pass_to_pass": [],
                }
            },
            "grading.fail_to_pass",
        ),
        (
            {
                "grading": {
                    "test_command": "x",
                    "log_parser": "pytest",
                    "fail_to_pass": ["a"],
                    "weights": {"fail_to_pass": 0.9, "pass_to_pass": 0.3},
                }
            },
            "grading.weights",
        ),
        ({"family": "harbor", "grading": {"test_command": "x", "tests_dir": "tests"}}, "grading.tests_dir"),
    ],
)
def test_bad_task_toml_is_refused_naming_the_field(over: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        task_of(**over)
    assert err.value.field.endswith(field), err.value


def test_multipliers_scale_a_tasks_limits() -> None:
    scaled = ContainerLimits(cpus=1.0, memory_mb=2048, storage_mb=100).scaled(cpus=0.5, memory=2.0)
    assert (scaled.cpus, scaled.memory_mb, scaled.storage_mb) == (0.5, 4096, 100)


def test_resolved_is_one_and_partial_is_the_weighted_share() -> None:
    task = task_of()
    passed = dict.fromkeys(["t.py::test_a", "t.py::test_b", "t.py::test_c"], TestStatus.PASSED)
    assert score_tests(task, passed).score == 1.0
    half = {**passed, "t.py::test_b": TestStatus.FAILED}
    assert score_tests(task, half).score == pytest.approx(0.7 * 0.5 + 0.3)


@pytest.mark.parametrize("status", [TestStatus.SKIPPED, TestStatus.ERROR, None])
def test_a_skipped_erroring_or_missing_test_fails(status: TestStatus | None) -> None:
    task = task_of()
    statuses = {"t.py::test_a": TestStatus.PASSED, "t.py::test_c": TestStatus.PASSED}
    if status is not None:
        statuses["t.py::test_b"] = status
    scored = score_tests(task, statuses)
    assert scored.score == pytest.approx(0.7 * 0.5 + 0.3)
    assert "t.py::test_b" in scored.checks[0].detail


def test_a_harbor_reward_comes_from_the_first_file_present() -> None:
    files = {"/logs/verifier/reward.txt": None, "/logs/verifier/reward.json": b'{"reward": 0.5}'}
    assert score_reward(files).score == 0.5
    assert score_reward({"/logs/verifier/reward.txt": b"1\n"}).score == 1.0


def test_a_missing_or_garbled_reward_is_an_assessable_zero() -> None:
    missing = score_reward({"/logs/verifier/reward.txt": None})
    garbled = score_reward({"/logs/verifier/reward.txt": b"all good"})
    assert (missing.score, missing.assessable, garbled.score, garbled.assessable) == (0.0, True, 0.0, True)


def test_review_signals_name_edited_tests_and_history_commands() -> None:
    diff = DIFF + TEST_DIFF + "diff --git a/tests/test_new.py b/tests/test_new.py\n"
    signals = review_signals(diff=diff, test_patch=TEST_DIFF, agent_log="$ git log --all\n$ ls\n")
    assert signals == (
        "diff edits files the test patch overwrites: tests/test_a.py",
        "diff edits test files: tests/test_new.py",
        "agent ran git history commands: git log",
    )
    assert review_signals(diff=DIFF, test_patch=TEST_DIFF) == ()


def test_diff_files_lists_both_sides_of_a_rename() -> None:
    assert diff_files("diff --git a/x.py b/y.py\nrename from x.py\n") == ["x.py", "y.py"]
