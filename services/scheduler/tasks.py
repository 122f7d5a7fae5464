"""Tasks and their execution groups: validation and planning (pure).

Limits are the contract of `SubmitTasks` (see proto/gyre/scheduler/v1/scheduler.proto); every
violation names the field path so a client can point at the exact task.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gyre.errors import InvalidArgument

MAX_TASKS_PER_REQUEST = 1000
MAX_NAME_CHARS = 200
MAX_PROMPT_BYTES = 1024 * 1024
MAX_GROUP_SIZE = 1024
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_TEMPLATE_CHARS = 4096
MAX_LABELS = 32
MAX_LABEL_VALUE_CHARS = 256
MAX_INFRA_RETRIES = 64
MAX_HARNESS_ENV = 64
MAX_HARNESS_ENV_VALUE_CHARS = 4096
DEFAULT_INFRA_RETRIES = 2
"""Replacements a task's group gets for infrastructure failures when its spec does not say: enough
to ride out a sandbox or grader that crashes now and then, bounded so a grader that always
crashes costs at most two extra executions per group."""

FAMILY_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
HARNESS_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
LABEL_KEY_RE = re.compile(r"[A-Za-z0-9_.-]{1,63}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
TEMPLATE_RE = re.compile(r"|task:[\w.-]+|taskset:[\w.-]+/[\w.-]+|(git\+)?(https|ssh)://\S+")
"""The template forms a runner can fill (it checks its own allow-lists too); never a host path."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskSpec:
    name: str
    family: str
    prompt: str
    group_size: int
    timeout_s: float
    harness: str
    workspace_template: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    deadline: datetime | None = None
    max_infra_retries: int = DEFAULT_INFRA_RETRIES
    harness_env: tuple[tuple[str, str], ...] = ()
    """Variables for the harness (sorted by key); what each harness takes is the runners' to say."""


SCALAR_SPEC_FIELDS = (
    "name",
    "family",
    "prompt",
    "group_size",
    "timeout_s",
    "harness",
    "workspace_template",
    "max_infra_retries",
)


def spec_from_record(
    record: object,
    *,
    labels: Mapping[str, str],
    deadline: datetime | None = None,
    harness_env: Mapping[str, str] | None = None,
) -> TaskSpec:
    """Build a TaskSpec from anything with its field names (a protobuf message, a table row)."""
    fields = {name: getattr(record, name) for name in SCALAR_SPEC_FIELDS}
    return TaskSpec(
        **fields,
        labels=tuple(sorted(labels.items())),
        deadline=deadline,
        harness_env=tuple(sorted((harness_env or {}).items())),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedExecution:
    execution_id: str
    index_in_group: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedTask:
    task_id: str
    spec: TaskSpec
    executions: tuple[PlannedExecution, ...]
    submitted_at: datetime


def validate_specs(specs: Sequence[TaskSpec]) -> None:
    """Raise InvalidArgument for the first problem, naming its field path.

    Example:
        validate_specs([TaskSpec(name="t", family="math", prompt="2+2?", group_size=0, ...)])
        -> InvalidArgument("tasks[0].group_size: must be between 1 and 1024, got 0")
    """
    if not specs:
        raise InvalidArgument("tasks", "must hold at least one task")
    if len(specs) > MAX_TASKS_PER_REQUEST:
        raise InvalidArgument("tasks", f"at most {MAX_TASKS_PER_REQUEST} tasks per request, got {len(specs)}")
    for i, spec in enumerate(specs):
        _validate_spec(spec, f"tasks[{i}]")


def _validate_spec(spec: TaskSpec, at: str) -> None:
    if not spec.name.strip():
        raise InvalidArgument(f"{at}.name", "is required")
    if len(spec.name) > MAX_NAME_CHARS or CONTROL_RE.search(spec.name):
        raise InvalidArgument(
            f"{at}.name", f"must be at most {MAX_NAME_CHARS} characters without control characters"
        )
    if not FAMILY_RE.fullmatch(spec.family):
        raise InvalidArgument(
            f"{at}.family", f"must be 1..64 of [a-z0-9_] starting with a letter, got {spec.family!r}"
        )
    if not spec.prompt.strip():
        raise InvalidArgument(f"{at}.prompt", "is required and must not be blank")
    if "\x00" in spec.prompt:
        raise InvalidArgument(f"{at}.prompt", "must not contain NUL characters (U+0000)")
    prompt_bytes = len(spec.prompt.encode())
    if prompt_bytes > MAX_PROMPT_BYTES:
        raise InvalidArgument(f"{at}.prompt", f"must be at most {MAX_PROMPT_BYTES} bytes, got {prompt_bytes}")
    if not 1 <= spec.group_size <= MAX_GROUP_SIZE:
        raise InvalidArgument(
            f"{at}.group_size", f"must be between 1 and {MAX_GROUP_SIZE}, got {spec.group_size}"
        )
    if not (math.isfinite(spec.timeout_s) and 0 < spec.timeout_s <= MAX_TIMEOUT_S):
        raise InvalidArgument(
            f"{at}.timeout_s", f"must be > 0 and at most {MAX_TIMEOUT_S:.0f} s, got {spec.timeout_s}"
        )
    if not HARNESS_RE.fullmatch(spec.harness):
        raise InvalidArgument(
            f"{at}.harness", f"must be 1..64 of [a-z0-9_-] starting with a letter, got {spec.harness!r}"
        )
    if len(spec.workspace_template) > MAX_TEMPLATE_CHARS or CONTROL_RE.search(spec.workspace_template):
        raise InvalidArgument(
            f"{at}.workspace_template",
            f"must be at most {MAX_TEMPLATE_CHARS} characters without control characters",
        )
    if not TEMPLATE_RE.fullmatch(spec.workspace_template):
        raise InvalidArgument(
            f"{at}.workspace_template",
            "must be empty, task:<name>, taskset:<set>/<name> or a git URL (https:// or ssh://); "
            f"a host path is never a workspace template, got {spec.workspace_template!r}",
        )
    if len(spec.labels) > MAX_LABELS:
        raise InvalidArgument(f"{at}.labels", f"at most {MAX_LABELS} labels, got {len(spec.labels)}")
    for key, value in spec.labels:
        if not LABEL_KEY_RE.fullmatch(key):
            raise InvalidArgument(f"{at}.labels[{key!r}]", "keys must be 1..63 of [A-Za-z0-9_.-]")
        if "\x00" in value:
            raise InvalidArgument(f"{at}.labels[{key!r}]", "values must not contain NUL characters (U+0000)")
        if len(value) > MAX_LABEL_VALUE_CHARS:
            raise InvalidArgument(
                f"{at}.labels[{key!r}]", f"values must be at most {MAX_LABEL_VALUE_CHARS} characters"
            )
    if not 0 <= spec.max_infra_retries <= MAX_INFRA_RETRIES:
        raise InvalidArgument(
            f"{at}.max_infra_retries",
            f"must be between 0 and {MAX_INFRA_RETRIES}, got {spec.max_infra_retries}",
        )
    if len(spec.harness_env) > MAX_HARNESS_ENV:
        raise InvalidArgument(
            f"{at}.harness_env", f"at most {MAX_HARNESS_ENV} variables, got {len(spec.harness_env)}"
        )
    for key, value in spec.harness_env:
        if not ENV_KEY_RE.fullmatch(key):
            raise InvalidArgument(f"{at}.harness_env[{key!r}]", "keys must be [A-Za-z_][A-Za-z0-9_]*, 1..128")
        if "\x00" in value or len(value) > MAX_HARNESS_ENV_VALUE_CHARS:
            raise InvalidArgument(
                f"{at}.harness_env[{key!r}]",
                f"values must be at most {MAX_HARNESS_ENV_VALUE_CHARS} characters without NUL",
            )


def validate_deadlines(specs: Sequence[TaskSpec], *, now: datetime) -> None:
    """A deadline already past can never be met: refuse it, naming the task.

    Example: tasks[1] with a deadline one second ago -> InvalidArgument("tasks[1].deadline: ...")
    """
    for i, spec in enumerate(specs):
        if spec.deadline is not None and spec.deadline <= now:
            raise InvalidArgument(
                f"tasks[{i}].deadline",
                f"is in the past ({spec.deadline.isoformat()}, now {now.isoformat()})",
            )


def execution_limit_s(spec: TaskSpec, *, now: datetime) -> float:
    """The time an execution admitted `now` may run: its timeout, cut to the task's deadline
    (0 when the deadline has passed).

    Example: timeout 600 s, deadline in 120 s -> 120.0
    """
    if spec.deadline is None:
        return spec.timeout_s
    return max(0.0, min(spec.timeout_s, (spec.deadline - now).total_seconds()))


def plan_tasks(
    specs: Sequence[TaskSpec],
    *,
    task_ids: Sequence[str],
    execution_ids: Sequence[Sequence[str]],
    now: datetime,
) -> list[PlannedTask]:
    """Give each validated spec its id and a group of executions (ids come from the shell).

    Example:
        plan_tasks([spec(group_size=2)], task_ids=["t1"], execution_ids=[["e1", "e2"]], now=T)
        -> [PlannedTask(task_id="t1", executions=(e1 #0, e2 #1), submitted_at=T)]
    """
    assert len(task_ids) == len(specs) == len(execution_ids)
    planned = []
    for spec, task_id, group_ids in zip(specs, task_ids, execution_ids, strict=True):
        assert len(group_ids) == spec.group_size
        executions = tuple(
            PlannedExecution(execution_id=e, index_in_group=i) for i, e in enumerate(group_ids)
        )
        planned.append(PlannedTask(task_id=task_id, spec=spec, executions=executions, submitted_at=now))
    return planned
