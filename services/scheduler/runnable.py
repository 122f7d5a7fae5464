"""Whether a task can run at all: harness, family, task and template known (pure).

`SubmitTasks` refuses here what would otherwise be accepted and only fail later, as a group of
reward-0 executions: a harness no runner has, a family no grader scores, a `task:` template
(or `gyre.task` label) that names no task, a task of another family than the spec says, a
template the runner cannot fetch. Local folders and archives are the runner's to check (its
file system is not the scheduler's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gyre.errors import InvalidArgument
from services.scheduler.tasks import TaskSpec

TASK_LABEL = "gyre.task"
"""Label naming the task an execution is graded against (a bundled name or a folder)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Catalog:
    harnesses: frozenset[str]
    families: frozenset[str]
    task_families: Mapping[str, str]
    """Bundled task name -> its family."""


def check_runnable(specs: Sequence[TaskSpec], catalog: Catalog) -> None:
    """Raise InvalidArgument naming the field of the first task that cannot run.

    Example:
        catalog: harnesses {gyre-agent}, families {terminal}, tasks {csvsum: terminal}
        TaskSpec(harness="gyre-agent", family="terminal", workspace_template="task:csvsum") -> ok
        TaskSpec(..., workspace_template="task:nope") -> tasks[0].workspace_template: no task 'nope' ...
    """
    for i, spec in enumerate(specs):
        _check(spec, catalog, f"tasks[{i}]")


def _check(spec: TaskSpec, catalog: Catalog, at: str) -> None:
    if spec.harness not in catalog.harnesses:
        raise InvalidArgument(
            f"{at}.harness", f"unknown harness {spec.harness!r}; known: {_list(catalog.harnesses)}"
        )
    if spec.family not in catalog.families:
        raise InvalidArgument(
            f"{at}.family", f"no grader for family {spec.family!r}; known: {_list(catalog.families)}"
        )
    template = spec.workspace_template
    lowered = template.lower()
    if lowered.startswith(("http://", "https://", "ftp://")) and not lowered.endswith(".git"):
        raise InvalidArgument(
            f"{at}.workspace_template",
            f"{template!r}: URLs are fetched only as git repositories (git+<url> or <url>.git)",
        )
    if template.startswith("task:"):
        _check_task(template.removeprefix("task:"), spec.family, catalog, f"{at}.workspace_template")
    labels = dict(spec.labels)
    named = labels.get(TASK_LABEL, "")
    if named and "/" not in named:
        _check_task(named, spec.family, catalog, f"{at}.labels[{TASK_LABEL!r}]")


def _check_task(name: str, family: str, catalog: Catalog, field: str) -> None:
    task_family = catalog.task_families.get(name)
    if task_family is None:
        raise InvalidArgument(field, f"no task {name!r}; known: {_list(catalog.task_families)}")
    if task_family != family:
        raise InvalidArgument(field, f"task {name!r} is of family {task_family!r}, the spec says {family!r}")


def _list(names: Mapping[str, str] | frozenset[str]) -> str:
    return ", ".join(sorted(names)) or "none"
