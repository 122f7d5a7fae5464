"""Tasks to submit, from JSON lines or from a bundled task's name (pure).

One task a line, the fields of `TaskSpec` (proto/gyre/scheduler/v1/scheduler.proto):

    {"name": "fix-slug", "family": "repo_repair", "prompt": "...", "group_size": 4,
     "timeout_s": 600, "harness": "gyre-agent", "workspace_template": "task:slugfix",
     "labels": {"split": "train"}, "max_infra_retries": 2,
     "harness_env": {"GYRE_AGENT_MAX_TURNS": "20"}}

`name`, `family`, `prompt` and `group_size` are required; `timeout_s` defaults to 600 s,
`harness` to `gyre-agent` and `max_infra_retries` (replacements for infrastructure failures) to
the scheduler's default. Blank lines are skipped. Types and unknown fields are checked here,
with the line and field named; ranges are the scheduler's to check (`tasks[i].field` in its
answer is mapped back to the line by `line_of`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gyre.errors import GyreError
from gyre.scheduler.v1 import scheduler_pb2

DEFAULT_TIMEOUT_S = 600.0
DEFAULT_HARNESS = "gyre-agent"
REQUIRED = ("name", "family", "prompt", "group_size")
TEXT_FIELDS = ("name", "family", "prompt", "harness", "workspace_template")
KNOWN = frozenset((*TEXT_FIELDS, "group_size", "timeout_s", "labels", "max_infra_retries", "harness_env"))
BATCH_FIELD = re.compile(r"^tasks\[(\d+)\]\.?(.*)$")
MAX_UINT32 = 2**32 - 1
"""The widest `group_size` the contract can carry; the scheduler refuses what is over its own limit."""


class TasksFileError(GyreError):
    """A line of a tasks file is not a task; the message names the line and the field."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NumberedTask:
    line: int
    spec: scheduler_pb2.TaskSpec


def _fail(source: str, line: int, field: str, problem: str) -> TasksFileError:
    return TasksFileError(f"{source} line {line}, field {field}: {problem}")


def _spec(raw: Mapping[str, object], source: str, line: int) -> scheduler_pb2.TaskSpec:
    for key in raw:
        if key not in KNOWN:
            raise _fail(source, line, key, f"unknown field; expected one of {sorted(KNOWN)}")
    for key in REQUIRED:
        if key not in raw:
            raise _fail(source, line, key, "is required")
    spec = scheduler_pb2.TaskSpec(timeout_s=DEFAULT_TIMEOUT_S, harness=DEFAULT_HARNESS)
    for key in TEXT_FIELDS:
        if key in raw:
            value = raw[key]
            if not isinstance(value, str):
                raise _fail(source, line, key, f"must be a string, got {value!r}")
            if not _is_unicode(value):
                raise _fail(source, line, key, f"must be Unicode text, got a lone surrogate in {value!r}")
            setattr(spec, key, value)
    size = raw["group_size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise _fail(source, line, "group_size", f"must be an integer >= 1, got {size!r}")
    if size > MAX_UINT32:
        raise _fail(source, line, "group_size", f"must be at most {MAX_UINT32}, got {size}")
    spec.group_size = size
    if "timeout_s" in raw:
        timeout = raw["timeout_s"]
        ok = isinstance(timeout, int | float) and not isinstance(timeout, bool) and math.isfinite(timeout)
        if not ok or timeout <= 0:  # type: ignore[operator]
            raise _fail(source, line, "timeout_s", f"must be a number > 0, got {timeout!r}")
        spec.timeout_s = float(timeout)  # type: ignore[arg-type]
    if "max_infra_retries" in raw:
        retries = raw["max_infra_retries"]
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise _fail(source, line, "max_infra_retries", f"must be an integer >= 0, got {retries!r}")
        spec.max_infra_retries = min(retries, 2**32 - 1)  # the scheduler refuses what is too many
    for key in ("labels", "harness_env"):
        pairs = raw.get(key, {})
        if not isinstance(pairs, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) and _is_unicode(k + v) for k, v in pairs.items()
        ):
            raise _fail(
                source,
                line,
                key,
                f"must map strings to strings (Unicode text: no lone surrogates), got {pairs!r}",
            )
        getattr(spec, key).update(pairs)
    return spec


def _is_unicode(text: str) -> bool:
    """Whether `text` can be sent at all: JSON's `\\ud800` escapes decode to lone surrogates, which
    no UTF-8 wire carries."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def decode_tasks_file(data: bytes, *, source: str) -> str:
    """A tasks file's text: UTF-8 (a BOM is allowed), or an error naming the first bad line.

    Example: decode_tasks_file(b'{"name": "caf\\xe9"}', source="t.jsonl")
        -> TasksFileError("t.jsonl line 1: not UTF-8 text (byte 0xe9 at column 14)")
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise TasksFileError(
            f"{source} line {line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at column {column})"
        ) from None


def parse_tasks(text: str, *, source: str) -> list[NumberedTask]:
    """Every task of a JSON-lines text, with its line number.

    Example:
        parse_tasks('{"name": "a", "family": "f", "prompt": "p", "group_size": "2"}', source="t.jsonl")
        -> TasksFileError("t.jsonl line 1, field group_size: must be an integer >= 1, got '2'")
    """
    tasks = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TasksFileError(
                f"{source} line {number}: not JSON ({exc.msg} at column {exc.colno})"
            ) from None
        if not isinstance(raw, dict):
            raise TasksFileError(f"{source} line {number}: must be a JSON object, got {type(raw).__name__}")
        tasks.append(NumberedTask(line=number, spec=_spec(raw, source, number)))
    if not tasks:
        raise TasksFileError(f"{source}: holds no task")
    return tasks


def line_of(field: str, tasks: Sequence[NumberedTask], *, source: str) -> str | None:
    """The scheduler's `tasks[i].field` as `<source> line L, field <field>`; None for another field.

    Example:
        line_of("tasks[1].harness", [task on line 1, task on line 3], source="t.jsonl")
        -> "t.jsonl line 3, field harness"
    """
    match = BATCH_FIELD.match(field)
    if match is None or int(match.group(1)) >= len(tasks):
        return None
    return f"{source} line {tasks[int(match.group(1))].line}, field {match.group(2) or 'task'}"


def bundled_spec(
    *, name: str, family: str, prompt: str, group_size: int, timeout_s: float, harness: str
) -> scheduler_pb2.TaskSpec:
    """The spec of a bundled task (`task:<name>` workspace, graded by its hidden tests)."""
    return scheduler_pb2.TaskSpec(
        name=name,
        family=family,
        prompt=prompt,
        group_size=group_size,
        timeout_s=timeout_s,
        harness=harness,
        workspace_template=f"task:{name}",
    )
