"""Pure parts of the operations tooling: tasks files, staleness explanations, the batch checksum."""

from __future__ import annotations

import dataclasses
import json
from datetime import UTC, datetime, timedelta

import pytest

from gyre_app.client.tasks_file import NumberedTask, TasksFileError, line_of, parse_tasks
from gyre_app.staleness import Timeline, VersionRun, distribution, version_runs, waited_most_for, waits
from services.trainer.batch_digest import batch_sha256
from services.trainer.samples import Sample

TASK = {"name": "a", "family": "arith", "prompt": "2+2?", "group_size": 2}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sample(**change: object) -> Sample:
    fields: dict[str, object] = {
        "execution_id": "e1",
        "trajectory_id": "e1/0",
        "agent_role": "main",
        "token_ids": (1, 2, 100, 101),
        "loss_mask": (False, False, True, True),
        "token_weight": (0.0, 0.0, 0.5, 0.5),
        "old_logprobs": (0.0, 0.0, -0.1, -0.2),
        "policy_versions": (0, 0, 3, 4),
        "reward": 1.0,
        "advantage": 0.5,
    }
    fields.update(change)
    return Sample(**fields)  # type: ignore[arg-type]


def test_a_tasks_file_gets_defaults_for_timeout_and_harness() -> None:
    [task] = parse_tasks(json.dumps(TASK), source="t.jsonl")
    assert (task.line, task.spec.timeout_s, task.spec.harness) == (1, 600.0, "gyre-agent")


def test_blank_lines_keep_line_numbers() -> None:
    tasks = parse_tasks("\n" + json.dumps(TASK) + "\n\n" + json.dumps(TASK), source="t.jsonl")
    assert [t.line for t in tasks] == [2, 4]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "{not json",
            "t.jsonl line 1: not JSON (Expecting property name enclosed in double quotes at column 2)",
        ),
        ("[1]", "t.jsonl line 1: must be a JSON object, got list"),
        (json.dumps({**TASK, "colour": "red"}), "t.jsonl line 1, field colour: unknown field"),
        (
            json.dumps({k: v for k, v in TASK.items() if k != "prompt"}),
            "t.jsonl line 1, field prompt: is required",
        ),
        (
            json.dumps({**TASK, "timeout_s": -1}),
            "t.jsonl line 1, field timeout_s: must be a number > 0, got -1",
        ),
        (
            json.dumps({**TASK, "max_infra_retries": -1}),
            "t.jsonl line 1, field max_infra_retries: must be an integer >= 0, got -1",
        ),
        (
            json.dumps({**TASK, "labels": {"a": 1}}),
            "t.jsonl line 1, field labels: must map strings to strings",
        ),
    ],
)
def test_a_malformed_line_is_named_with_its_field(line: str, message: str) -> None:
    with pytest.raises(TasksFileError) as err:
        parse_tasks(line, source="t.jsonl")
    assert str(err.value).startswith(message)


def test_an_empty_tasks_file_is_refused() -> None:
    with pytest.raises(TasksFileError, match="holds no task"):
        parse_tasks("\n\n", source="t.jsonl")


def test_a_scheduler_field_path_maps_back_to_its_line() -> None:
    tasks = parse_tasks(json.dumps(TASK) + "\n\n" + json.dumps(TASK), source="t.jsonl")
    assert line_of("tasks[1].harness", tasks, source="t.jsonl") == "t.jsonl line 3, field harness"
    assert line_of("request_id", tasks, source="t.jsonl") is None
    assert line_of("tasks[7].name", [NumberedTask(line=1, spec=tasks[0].spec)], source="t.jsonl") is None


def test_version_runs_group_consecutive_targets_of_one_version() -> None:
    runs = version_runs((0, 3, 3, 0, 4, 4, 4), (False, True, True, False, True, True, True))
    assert runs == [
        VersionRun(version=3, first=1, last=2, num_tokens=2),
        VersionRun(version=4, first=4, last=6, num_tokens=3),
    ]


def test_distribution_counts_samples_per_staleness() -> None:
    assert distribution([0, 2, 0, 1]) == {0: 2, 1: 1, 2: 1}


def test_waits_name_each_stage_and_the_longest() -> None:
    timeline = Timeline(
        admitted_at=T0,
        started_at=T0 + timedelta(seconds=2),
        ended_at=T0 + timedelta(seconds=50),
        group_ended_at=T0 + timedelta(seconds=80),
        consumed_at=T0 + timedelta(seconds=81),
    )
    assert [round(s) for _, s in waits(timeline)] == [2, 48, 30, 1]
    assert waited_most_for(timeline) == "its own rollout"


def test_unknown_stages_merge_into_the_next_known_one() -> None:
    timeline = Timeline(
        admitted_at=T0,
        started_at=None,
        ended_at=None,
        group_ended_at=None,
        consumed_at=T0 + timedelta(seconds=9),
    )
    [(stage, seconds)] = waits(timeline)
    assert stage.startswith("a rollout slot + its own rollout + the rest of its group") and seconds == 9


def test_the_batch_checksum_depends_on_order() -> None:
    a, b = sample(), sample(execution_id="e2", trajectory_id="e2/0")
    assert batch_sha256([a, b]) != batch_sha256([b, a])


def test_the_batch_checksum_sees_one_token_weight() -> None:
    changed = dataclasses.replace(sample(), token_weight=(0.0, 0.0, 0.5, 0.25))
    assert batch_sha256([sample()]) != batch_sha256([changed])


def test_the_batch_checksum_is_stable_for_equal_batches() -> None:
    assert batch_sha256([sample()]) == batch_sha256([sample()])
