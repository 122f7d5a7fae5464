"""What the runner is asked to run, and its checks (pure).

A `Launch` is the runner's view of one execution to start, built from `StartExecution` or from
`ExecutionScheduled`; `validate_launch` names the first bad field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from gyre.errors import InvalidArgument
from gyre.ids import is_uuid, validate_request_id

MAX_PROMPT_BYTES = 1024 * 1024
MAX_TIMEOUT_S = 7 * 24 * 3600.0
MAX_HARNESS_ENV = 64
FAMILY_RE = re.compile(r"[a-z][a-z0-9_]{0,63}")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
TASK_LABEL = "gyre.task"
BOUNDS_ENV = ("GYRE_HARNESS_MAX_TURNS", "GYRE_HARNESS_MAX_OUTPUT_TOKENS")
"""Harness bounds an execution may set in `harness_env`: positive integers (services/runner/harness.py)."""

ENDED = frozenset({"finished", "timed_out", "failed", "cancelled"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Launch:
    request_id: str
    task_id: str
    execution_id: str
    index_in_group: int
    harness: str
    prompt: str
    workspace_template: str
    timeout_s: float
    family: str = ""
    task: str = ""
    harness_env: tuple[tuple[str, str], ...] = ()
    min_policy_version: int = 0
    """The execution's admitted version: the proxy serves its calls from weights this new or newer."""


def grading_task(*, workspace_template: str, labels: dict[str, str], task: str = "") -> str:
    """The task definition the grader will use.

    Example:
        grading_task(workspace_template="task:wordfreq", labels={}) -> "wordfreq"
        grading_task(workspace_template="taskset:s/t", labels={"gyre.task": "/srv/s/t"}) -> "/srv/s/t"
    """
    if task:
        return task
    if labels.get(TASK_LABEL):
        return labels[TASK_LABEL]
    if workspace_template.startswith("task:"):
        return workspace_template.removeprefix("task:")
    return ""


def validate_launch(launch: Launch, *, harnesses: frozenset[str], reserved_env: frozenset[str]) -> None:
    validate_request_id(launch.request_id)
    if not is_uuid(launch.task_id):
        raise InvalidArgument("execution.task_id", f"must be a task id (a UUID), got {launch.task_id!r}")
    if not is_uuid(launch.execution_id):
        raise InvalidArgument(
            "execution.execution_id", f"must be an execution id (a UUID), got {launch.execution_id!r}"
        )
    if launch.harness not in harnesses:
        raise InvalidArgument(
            "harness", f"unknown harness {launch.harness!r}; known: {', '.join(sorted(harnesses))}"
        )
    if not launch.prompt.strip():
        raise InvalidArgument("prompt", "is required and must not be blank")
    if len(launch.prompt.encode()) > MAX_PROMPT_BYTES:
        raise InvalidArgument("prompt", f"must be at most {MAX_PROMPT_BYTES} bytes")
    if not (math.isfinite(launch.timeout_s) and 0 < launch.timeout_s <= MAX_TIMEOUT_S):
        raise InvalidArgument(
            "timeout_s", f"must be > 0 and at most {MAX_TIMEOUT_S:.0f} s, got {launch.timeout_s}"
        )
    if launch.family and not FAMILY_RE.fullmatch(launch.family):
        raise InvalidArgument(
            "family", f"must be 1..64 of [a-z0-9_] starting with a letter, got {launch.family!r}"
        )
    if "\x00" in launch.workspace_template or len(launch.workspace_template) > 4096:
        raise InvalidArgument("workspace_template", "must be at most 4096 characters without NUL")
    if len(launch.harness_env) > MAX_HARNESS_ENV:
        raise InvalidArgument(
            "harness_env", f"at most {MAX_HARNESS_ENV} entries, got {len(launch.harness_env)}"
        )
    for key, value in launch.harness_env:
        if not ENV_KEY_RE.fullmatch(key):
            raise InvalidArgument(f"harness_env[{key!r}]", "keys must be [A-Za-z_][A-Za-z0-9_]*")
        if key in reserved_env:
            raise InvalidArgument(
                f"harness_env[{key!r}]", "is set by the runner (model URL, token) and cannot be overridden"
            )
        if "\x00" in value:
            raise InvalidArgument(f"harness_env[{key!r}]", "must not contain NUL")
        if key in BOUNDS_ENV and not (value.isascii() and value.isdigit() and 0 < int(value) < 10**9):
            raise InvalidArgument(f"harness_env[{key!r}]", f"must be a positive integer, got {value!r}")


def recovered_launch(row: Any) -> Launch:
    """The launch of an execution a previous runner process recorded (the prompt is not kept)."""
    return Launch(
        request_id=row.request_id,
        task_id=str(row.task_id),
        execution_id=str(row.execution_id),
        index_in_group=row.index_in_group,
        harness=row.harness,
        prompt="-",
        workspace_template="",
        timeout_s=row.timeout_s,
        family=row.family,
        task=row.task,
    )
