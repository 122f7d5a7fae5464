"""Task definitions: the `task.toml` format, its checks, and where tasks are found.

`parse_task` is pure (a dict in, a `TaskDef` out, every problem named by its field);
`load_task` reads a task folder or a bundled task by name (shell).

A task folder holds `task.toml`, `workspace/` (what the harness starts from) and `hidden/`
(grader files the harness never sees). A pytest check's tests *return* the value under test;
`hidden/<tests>.expected.json` maps each test name to the value it must return, and stays on the
host (see `integrity`). See docs/tutorials/own-tasks.md, "The task format".
"""

from __future__ import annotations

import json
import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gyre.errors import InvalidArgument

BUNDLED = Path(__file__).resolve().parent / "tasks"
FAMILIES = ("repo_generation", "repo_repair", "terminal")
NAME_RE = re.compile(r"[a-z][a-z0-9_-]{0,63}")
REPAIR_CHECKS = ("fail_to_pass", "pass_to_pass")


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    name: str
    tests: str
    """Hidden test file, relative to the task folder."""
    weight: float
    expected: Mapping[str, Any] = field(default_factory=dict)
    """Test name -> the value it must return (from `expected_path`); the exact set graded."""

    @property
    def expected_path(self) -> str:
        """Example: Check(tests="hidden/test_count.py", ...) -> "hidden/test_count.expected.json"."""
        return self.tests.removesuffix(".py") + ".expected.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskDef:
    name: str
    family: str
    prompt: str
    folder: Path
    requires: tuple[str, ...]
    """Workspace paths of which at least one must exist for the work to be assessable."""
    checks: tuple[Check, ...] = ()
    check_script: str = ""
    """Terminal tasks: hidden script printing `PASS <name>` / `FAIL <name>` lines."""
    verdicts: tuple[str, ...] = ()
    """Terminal tasks: the verdict names the script prints; when given, other names count for
    nothing and a missing one fails (the tested programs share the script's output)."""
    grader_timeout_s: float = 120.0
    completion_bonus: float = 0.0
    """repo_generation: share of a package's weight earned only when all its tests pass."""


def typed_field(raw: dict[str, Any], key: str, kind: type, at: str, default: Any = None) -> Any:
    """`raw[key]` checked to be a `kind` (an int is taken as a float); absent, `default`, or an
    error naming `at.key` when there is none."""
    if key not in raw:
        if default is None:
            raise InvalidArgument(f"{at}.{key}", "is required")
        return default
    value = raw[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise InvalidArgument(f"{at}.{key}", f"must be a {kind.__name__}, got {type(value).__name__}")
    return value


def parse_task(raw: dict[str, Any], *, folder: Path, at: str = "task.toml") -> TaskDef:
    """Validate a parsed task.toml.

    Example:
        parse_task({"name": "t", "family": "terminal", "prompt": "p", "requires": ["a"],
                    "check": "hidden/check.sh"}, folder=Path("/tasks/t"))
        -> TaskDef(name="t", family="terminal", check_script="hidden/check.sh", ...)
    """
    name = typed_field(raw, "name", str, at)
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"{at}.name", f"must be 1..64 of [a-z0-9_-] starting with a letter, got {name!r}"
        )
    family = typed_field(raw, "family", str, at)
    if family not in FAMILIES:
        raise InvalidArgument(f"{at}.family", f"must be one of {', '.join(FAMILIES)}, got {family!r}")
    prompt = typed_field(raw, "prompt", str, at)
    if not prompt.strip():
        raise InvalidArgument(f"{at}.prompt", "must not be blank")
    requires = typed_field(raw, "requires", list, at)
    if not requires or not all(
        isinstance(r, str) and r and not r.startswith("/") and ".." not in r for r in requires
    ):
        raise InvalidArgument(f"{at}.requires", "must list workspace-relative paths (at least one)")
    timeout = typed_field(raw, "grader_timeout_s", float, at, 120.0)
    if not (math.isfinite(timeout) and 0 < timeout <= 3600):
        raise InvalidArgument(f"{at}.grader_timeout_s", f"must be in (0, 3600], got {timeout}")
    bonus = typed_field(raw, "completion_bonus", float, at, 0.0)
    if not 0 <= bonus < 1:
        raise InvalidArgument(f"{at}.completion_bonus", f"must be in [0, 1), got {bonus}")
    checks = tuple(_check(c, at=f"{at}.checks[{i}]") for i, c in enumerate(raw.get("checks", [])))
    script = typed_field(raw, "check", str, at, "")
    verdicts = typed_field(raw, "verdicts", list, at, [])
    if not all(isinstance(v, str) and v and " " not in v for v in verdicts):
        raise InvalidArgument(f"{at}.verdicts", "must list verdict names (words without spaces)")
    if verdicts and family != "terminal":
        raise InvalidArgument(f"{at}.verdicts", "only terminal tasks declare verdict names")
    if family == "terminal":
        if not script or checks:
            raise InvalidArgument(f"{at}.check", "terminal tasks name one check script and no [[checks]]")
        _hidden_path(script, at=f"{at}.check")
    else:
        if not checks:
            raise InvalidArgument(f"{at}.checks", f"{family} tasks need at least one [[checks]] entry")
        total = sum(c.weight for c in checks)
        if abs(total - 1.0) > 1e-6:
            raise InvalidArgument(f"{at}.checks", f"weights must sum to 1, got {total:g}")
        if len({c.name for c in checks}) != len(checks):
            raise InvalidArgument(f"{at}.checks", "names must be unique")
        if family == "repo_repair" and {c.name for c in checks} - set(REPAIR_CHECKS):
            raise InvalidArgument(
                f"{at}.checks", f"repo_repair checks are named {' and '.join(REPAIR_CHECKS)}"
            )
    return TaskDef(
        name=name,
        family=family,
        prompt=prompt,
        folder=folder,
        requires=tuple(requires),
        checks=checks,
        check_script=script,
        verdicts=tuple(verdicts),
        grader_timeout_s=timeout,
        completion_bonus=bonus,
    )


def _hidden_path(path: str, *, at: str) -> None:
    if not path.startswith("hidden/") or ".." in path.split("/"):
        raise InvalidArgument(at, f"must be a path under hidden/, got {path!r}")


def _check(raw: Any, *, at: str) -> Check:
    if not isinstance(raw, dict):
        raise InvalidArgument(at, "must be a table")
    name = typed_field(raw, "name", str, at)
    tests = typed_field(raw, "tests", str, at)
    _hidden_path(tests, at=f"{at}.tests")
    if not tests.endswith(".py"):
        raise InvalidArgument(f"{at}.tests", f"must be a pytest file (*.py), got {tests!r}")
    weight = typed_field(raw, "weight", float, at)
    if not (math.isfinite(weight) and 0 < weight <= 1):
        raise InvalidArgument(f"{at}.weight", f"must be in (0, 1], got {weight}")
    return Check(name=name, tests=tests, weight=weight)


def task_folder(ref: str, *, bundled: Path = BUNDLED) -> Path:
    """A folder path as given, a bare name under the bundled tasks.

    Example: task_folder("wordfreq") -> BUNDLED / "wordfreq"; task_folder("./t") -> Path("./t")
    """
    return Path(ref) if ("/" in ref or ref.startswith(".")) else bundled / ref


def load_task(ref: str, *, bundled: Path = BUNDLED) -> TaskDef:
    """A task by bundled name (`wordfreq`) or folder path; a clear error when it is missing or malformed."""
    if not ref:
        raise InvalidArgument("task", "is required: a bundled task name or a task folder")
    folder = task_folder(ref, bundled=bundled)
    toml_path = folder / "task.toml"
    if not toml_path.is_file():
        known = ", ".join(sorted(p.name for p in bundled.iterdir() if (p / "task.toml").is_file()))
        raise InvalidArgument("task", f"no task.toml in {str(folder)!r} (bundled tasks: {known})")
    try:
        raw = tomllib.loads(toml_path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument("task", f"{toml_path} is not valid TOML: {exc}") from exc
    task = parse_task(raw, folder=folder.resolve(), at=str(toml_path))
    for path in [c.tests for c in task.checks] + ([task.check_script] if task.check_script else []):
        if not (folder / path).is_file():
            raise InvalidArgument(str(toml_path), f"grader file {path!r} does not exist")
    return replace(task, checks=tuple(_with_expected(c, folder) for c in task.checks))


def _with_expected(check: Check, folder: Path) -> Check:
    path = folder / check.expected_path
    try:
        expected = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise InvalidArgument(
            str(path), f"expected values of {check.tests} are missing or not JSON: {exc}"
        ) from exc
    if not (isinstance(expected, dict) and expected and all(k.startswith("test") for k in expected)):
        raise InvalidArgument(str(path), "must map each test name (test_...) to the value it returns")
    return replace(check, expected=expected)
