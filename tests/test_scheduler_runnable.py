"""What SubmitTasks can tell will never run is refused at submission (pure checks + the catalog)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gyre.errors import InvalidArgument
from services.evaluator.container_task import CONTAINER_FAMILIES
from services.evaluator.taskset import FAMILIES
from services.runner.harness import HARNESSES
from services.scheduler.catalog import load_catalog
from services.scheduler.config import SchedulerSettings
from services.scheduler.runnable import Catalog, check_runnable
from services.scheduler.tasks import TaskSpec

CATALOG = Catalog(
    harnesses=frozenset({"gyre-agent"}),
    families=frozenset({"terminal", "repo_repair"}),
    task_families={"csvsum": "terminal", "slugfix": "repo_repair"},
)
GOOD = TaskSpec(
    name="sum", family="terminal", prompt="Sum it.", group_size=2, timeout_s=60, harness="gyre-agent"
)


def refused_field(spec: TaskSpec) -> str:
    with pytest.raises(InvalidArgument) as err:
        check_runnable([GOOD, spec], CATALOG)
    return err.value.field


def test_known_harness_family_and_task_pass() -> None:
    check_runnable([GOOD, replace(GOOD, workspace_template="task:csvsum")], CATALOG)


def test_git_urls_and_local_paths_are_left_to_the_runner() -> None:
    for template in ("git+https://example.com/r", "https://example.com/r.git", "/data/ws", "/data/ws.tgz"):
        check_runnable([replace(GOOD, workspace_template=template)], CATALOG)


def test_an_unknown_harness_is_refused() -> None:
    assert refused_field(replace(GOOD, harness="codex")) == "tasks[1].harness"


def test_a_family_no_grader_scores_is_refused() -> None:
    assert refused_field(replace(GOOD, family="poetry")) == "tasks[1].family"


def test_a_task_template_that_names_no_task_is_refused() -> None:
    assert refused_field(replace(GOOD, workspace_template="task:nope")) == "tasks[1].workspace_template"


def test_a_task_of_another_family_is_refused() -> None:
    spec = replace(GOOD, workspace_template="task:slugfix")
    with pytest.raises(InvalidArgument, match="family 'repo_repair', the spec says 'terminal'"):
        check_runnable([spec], CATALOG)


def test_a_task_label_is_checked_like_a_template() -> None:
    spec = replace(GOOD, labels=(("gyre.task", "nope"),))
    assert refused_field(spec) == "tasks[1].labels['gyre.task']"


def test_an_http_template_is_refused() -> None:
    spec = replace(GOOD, workspace_template="https://example.com/ws.tar.gz")
    assert refused_field(spec) == "tasks[1].workspace_template"


def test_the_default_catalog_is_what_the_runner_and_evaluator_have() -> None:
    catalog = load_catalog(SchedulerSettings())
    assert catalog.harnesses == HARNESSES
    assert catalog.families == frozenset(FAMILIES) | frozenset(CONTAINER_FAMILIES)
    assert catalog.task_families == {
        "csvsum": "terminal",
        "slugfix": "repo_repair",
        "wordfreq": "repo_generation",
    }
