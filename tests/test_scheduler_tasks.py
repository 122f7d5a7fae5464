"""Validation and planning of tasks (pure core of SubmitTasks)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from gyre.errors import InvalidArgument
from gyre.ids import validate_request_id
from services.scheduler.tasks import TaskSpec, plan_tasks, validate_specs

GOOD = TaskSpec(
    name="fizzbuzz",
    family="repo_generation",
    prompt="Write fizzbuzz.",
    group_size=4,
    timeout_s=600.0,
    harness="gyre-agent",
)


def test_a_good_spec_passes() -> None:
    validate_specs([GOOD, replace(GOOD, labels=(("split", "train"),))])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"name": ""}, "tasks[1].name"),
        ({"name": "x" * 201}, "tasks[1].name"),
        ({"name": "bad\nname"}, "tasks[1].name"),
        ({"family": "Repo"}, "tasks[1].family"),
        ({"family": ""}, "tasks[1].family"),
        ({"prompt": "   "}, "tasks[1].prompt"),
        ({"prompt": "é" * (512 * 1024 + 1)}, "tasks[1].prompt"),
        ({"group_size": 0}, "tasks[1].group_size"),
        ({"group_size": 1025}, "tasks[1].group_size"),
        ({"timeout_s": 0.0}, "tasks[1].timeout_s"),
        ({"timeout_s": float("nan")}, "tasks[1].timeout_s"),
        ({"timeout_s": float("inf")}, "tasks[1].timeout_s"),
        ({"harness": ""}, "tasks[1].harness"),
        ({"harness": "claude code"}, "tasks[1].harness"),
        ({"workspace_template": "x" * 4097}, "tasks[1].workspace_template"),
        ({"labels": tuple((f"k{i}", "v") for i in range(33))}, "tasks[1].labels"),
        ({"labels": (("bad key", "v"),)}, "tasks[1].labels['bad key']"),
        ({"labels": (("k", "v" * 257),)}, "tasks[1].labels['k']"),
        ({"max_infra_retries": -1}, "tasks[1].max_infra_retries"),
        ({"max_infra_retries": 65}, "tasks[1].max_infra_retries"),
        ({"harness_env": (("1BAD", "v"),)}, "tasks[1].harness_env['1BAD']"),
        ({"harness_env": (("K", "a\x00b"),)}, "tasks[1].harness_env['K']"),
        ({"harness_env": tuple((f"K{i}", "v") for i in range(65))}, "tasks[1].harness_env"),
    ],
)
def test_each_bad_field_is_named(change: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_specs([GOOD, replace(GOOD, **change)])  # type: ignore[arg-type]
    assert err.value.field == field


def test_the_batch_size_is_bounded() -> None:
    with pytest.raises(InvalidArgument, match=r"^tasks: must hold at least one"):
        validate_specs([])
    with pytest.raises(InvalidArgument, match="at most 1000 tasks"):
        validate_specs([GOOD] * 1001)


@pytest.mark.parametrize("request_id", ["", "has space", "x" * 129, "semi;colon"])
def test_request_ids_are_checked(request_id: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_request_id(request_id)
    assert err.value.field == "request_id"


def test_planning_gives_each_task_its_group_in_order() -> None:
    now = datetime(2026, 11, 29, tzinfo=UTC)
    planned = plan_tasks(
        [replace(GOOD, group_size=2), replace(GOOD, group_size=1)],
        task_ids=["t1", "t2"],
        execution_ids=[["e1", "e2"], ["e3"]],
        now=now,
    )
    assert [(t.task_id, [(e.execution_id, e.index_in_group) for e in t.executions]) for t in planned] == [
        ("t1", [("e1", 0), ("e2", 1)]),
        ("t2", [("e3", 0)]),
    ]
    assert all(t.submitted_at == now for t in planned)
