"""What no registered runner could run, and a prompt no model call could hold, are refused at
submission with the field named (services/scheduler/runner_offers.py, pure, with offers built the
way the runner builds its own; services/scheduler/prompt_window.py); a task's harness_env
reaches the runner's launch."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest
from proxy_support import write_tokenizer

from gyre.common.v1 import ids_pb2
from gyre.errors import InvalidArgument
from gyre.scheduler.v1 import scheduler_pb2
from services.runner.codec import launch_from_scheduled
from services.runner.executions import validate_launch
from services.runner.harness import HARNESSES, REGISTRY, RESERVED_ENV
from services.scheduler.codec import execution_scheduled
from services.scheduler.prompt_window import PromptWindow
from services.scheduler.runner_offers import HarnessOffer, RunnerOffer, check_offered
from services.scheduler.tasks import TaskSpec

TASK = TaskSpec(
    name="t", family="terminal", prompt="Do it.", group_size=2, timeout_s=60.0, harness="gyre-agent"
)


def runner(
    *, claude_found: bool = False, prefixes: tuple[str, ...] = ("https://github.com/org/",)
) -> RunnerOffer:
    """A runner as `services.runner.registration.offer` describes one: every adapter, `claude`
    found or not, one task set with one task."""
    return RunnerOffer(
        runner_id="host:/sandboxes",
        harnesses={
            name: HarnessOffer(
                binary=h.binary,
                binary_found=not h.binary or (claude_found and h.binary == "claude"),
                env_values=dict(h.env_values),
            )
            for name, h in REGISTRY.items()
        },
        task_sets=frozenset({"swe"}),
        task_set_tasks=frozenset({"swe/fix-1"}),
        template_url_prefixes=prefixes,
        reserved_env=RESERVED_ENV,
    )


def refused(spec: TaskSpec, offer: RunnerOffer) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as err:
        check_offered([TASK, spec], [offer])
    return err.value


def test_without_a_registered_runner_nothing_is_checked_here() -> None:
    check_offered([replace(TASK, harness="claude-code", workspace_template="https://x.example/r.git")], [])


def test_a_runnable_task_passes() -> None:
    git = replace(TASK, workspace_template="git+https://github.com/org/repo")
    claude = replace(TASK, harness="claude-code")
    check_offered(
        [
            replace(TASK, workspace_template="taskset:swe/fix-1"),
            replace(git, harness_env=(("GYRE_AGENT_MAX_TURNS", "3"),)),
            replace(claude, harness_env=(("GYRE_CLAUDE_CODE_TOOLS", "Bash,Read"), ("MY_VAR", "x"))),
        ],
        [runner(claude_found=True)],
    )


def test_a_harness_whose_program_no_runner_found_names_it() -> None:
    err = refused(replace(TASK, harness="claude-code"), runner())
    assert err.field == "tasks[1].harness" and "'claude' is not on the PATH" in err.problem


def test_a_harness_no_runner_offers_is_refused() -> None:
    err = refused(replace(TASK, harness="aider"), runner())
    assert (
        err.field == "tasks[1].harness" and "offered: claude-code, gyre-agent, mini-swe-agent" in err.problem
    )


@pytest.mark.parametrize(
    ("template", "says"),
    [
        ("git+https://gitlab.example/x/repo", "under none of the git URL prefixes"),
        ("https://github.com/other/repo.git", "https://github.com/org/"),
        ("taskset:nope/fix-1", "no runner has the task set 'nope'"),
        ("taskset:swe/fix-2", "has no task 'fix-2'"),
    ],
)
def test_a_template_no_runner_can_fill_is_refused(template: str, says: str) -> None:
    err = refused(replace(TASK, workspace_template=template), runner())
    assert err.field == "tasks[1].workspace_template" and says in err.problem


def test_git_templates_are_refused_when_no_prefix_is_allowed() -> None:
    err = refused(replace(TASK, workspace_template="https://github.com/org/r.git"), runner(prefixes=()))
    assert "GYRE_RUNNER_TEMPLATE_URLS is empty" in err.problem


@pytest.mark.parametrize(
    ("harness", "env", "says"),
    [
        ("claude-code", ("GYRE_CLAUDE_CODE_TOOLS", "Bash; rm -rf /"), "takes values matching"),
        ("claude-code", ("GYRE_HARNESS_MAX_TURNS", "0"), "takes values matching"),
        ("gyre-agent", ("GYRE_CLAUDE_CODE_TOOLS", "Bash"), "is read by claude-code, not by gyre-agent"),
        ("gyre-agent", ("GYRE_AGENT_MAX_TOKENS", "many"), "takes values matching"),
        ("claude-code", ("ANTHROPIC_API_KEY", "sk-mine"), "is set by the runner"),
    ],
)
def test_a_harness_env_the_harness_does_not_take_is_refused(
    harness: str, env: tuple[str, str], says: str
) -> None:
    err = refused(replace(TASK, harness=harness, harness_env=(env,)), runner(claude_found=True))
    assert err.field == f"tasks[1].harness_env[{env[0]!r}]" and says in err.problem


def test_a_prompt_that_alone_fills_the_context_window_is_refused(tmp_path: Path) -> None:
    """services/scheduler/prompt_window.py, with the tiny model's real tokenizer and a 64-token window."""
    model = write_tokenizer(tmp_path / "model")
    (model / "config.json").write_text('{"max_position_embeddings": 64}')
    window = PromptWindow(model)
    window.check([TASK, replace(TASK, prompt="word " * 10)])  # short: not even tokenized
    with pytest.raises(InvalidArgument) as err:
        window.check([TASK, replace(TASK, prompt="word " * 200)])
    assert err.value.field == "tasks[1].prompt" and "context window is 64" in err.value.problem


def test_an_unreadable_model_folder_checks_no_prompt(tmp_path: Path) -> None:
    PromptWindow(tmp_path / "missing").check([replace(TASK, prompt="word " * 200)])


def test_a_tasks_harness_env_reaches_the_runners_launch() -> None:
    """The scheduler's ExecutionScheduled carries it; the runner's launch gives it to the harness."""
    task = scheduler_pb2.Task(
        task_id=str(uuid.uuid4()),
        spec=scheduler_pb2.TaskSpec(
            prompt="Do it.", timeout_s=60, harness="gyre-agent", harness_env={"GYRE_AGENT_MAX_TURNS": "3"}
        ),
    )
    ref = ids_pb2.ExecutionRef(task_id=task.task_id, execution_id=str(uuid.uuid4()))
    launch = launch_from_scheduled("e1", execution_scheduled(task, ref, admitted_version=0))
    validate_launch(launch, harnesses=HARNESSES, reserved_env=RESERVED_ENV)
    assert launch.harness_env == (("GYRE_AGENT_MAX_TURNS", "3"),)
