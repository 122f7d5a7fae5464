"""Tasks that bring their own OCI image: the `swebench` and `harbor` families of `task.toml` (pure
parsing; `load_container_task` reads the folder).

The folder layout and fields are the contract with `gyre tasks import` (docs/datasets.md):

    <name>/task.toml      name, family, prompt, grader_timeout_s, [source], [environment], [grading]
    <name>/hidden/        never enters the agent's container: test.patch, gold.patch (swebench),
                          tests/ and solution/ (harbor)
    <name>/environment/   harbor: the task's own Dockerfile folder

Example:
    parse_container_task({"name": "t", "family": "swebench", "prompt": "fix it",
        "environment": {"image": "img:1"},
        "grading": {"test_command": "pytest -rA", "log_parser": "pytest",
                    "fail_to_pass": ["t.py::test_a"], "pass_to_pass": []}}, folder=Path("/x/t"))
    -> ContainerTask(name="t", family="swebench", image="img:1", workdir="/testbed", ...)
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gyre.errors import InvalidArgument
from gyre.sandbox.backend import ContainerLimits
from services.evaluator.taskset import NAME_RE, typed_field
from services.evaluator.test_logs import PARSERS

CONTAINER_FAMILIES = ("swebench", "harbor")
SOURCE_FORMATS = ("swebench", "swegym", "swesmith", "r2e", "harbor")
AGENT_DIFF = "agent.diff"
"""What the runner exports from an agent's container into the workspace folder it reports: the
binary diff against the base commit (staged, new files included)..."""
AGENT_LOG = "agent.log"
"""...and the harness's log, where a reviewer's signals (git history commands) are looked for."""
DEFAULT_REWARD_FILES = ("/logs/verifier/reward.txt", "/logs/verifier/reward.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContainerTask:
    name: str
    family: str
    prompt: str
    folder: Path
    grader_timeout_s: float
    source_format: str
    source_id: str
    repo: str
    base_commit: str
    image: str
    workdir: str
    limits: ContainerLimits
    test_command: str
    dockerfile: str = ""
    log_parser: str = ""
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    weight_fail_to_pass: float = 0.7
    weight_pass_to_pass: float = 0.3
    tests_dir: str = ""
    """harbor: folder of hidden tests, relative to the task folder (uploaded to /tests)."""
    reward_files: tuple[str, ...] = DEFAULT_REWARD_FILES
    test_timeout_s: float = 600.0

    @property
    def test_patch(self) -> Path:
        return self.folder / "hidden" / "test.patch"

    @property
    def gold_patch(self) -> Path:
        return self.folder / "hidden" / "gold.patch"


def _table(raw: dict[str, Any], key: str, at: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise InvalidArgument(f"{at}.{key}", "must be a table")
    return value


def _ids(raw: dict[str, Any], key: str, at: str) -> tuple[str, ...]:
    value = typed_field(raw, key, list, at, [])
    if not all(isinstance(v, str) and v for v in value):
        raise InvalidArgument(f"{at}.{key}", "must list test ids (non-empty strings)")
    return tuple(value)


def parse_container_task(raw: dict[str, Any], *, folder: Path, at: str = "task.toml") -> ContainerTask:
    name = typed_field(raw, "name", str, at)
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(
            f"{at}.name", f"must be 1..64 of [a-z0-9_-] starting with a letter, got {name!r}"
        )
    family = typed_field(raw, "family", str, at)
    if family not in CONTAINER_FAMILIES:
        raise InvalidArgument(
            f"{at}.family", f"must be one of {', '.join(CONTAINER_FAMILIES)}, got {family!r}"
        )
    prompt = typed_field(raw, "prompt", str, at)
    if not prompt.strip():
        raise InvalidArgument(f"{at}.prompt", "must not be blank")
    timeout = typed_field(raw, "grader_timeout_s", float, at, 1800.0)
    if not (math.isfinite(timeout) and 0 < timeout <= 7200):
        raise InvalidArgument(f"{at}.grader_timeout_s", f"must be in (0, 7200], got {timeout}")
    source = _table(raw, "source", at)
    fmt = typed_field(source, "format", str, f"{at}.source", family)
    if fmt not in SOURCE_FORMATS:
        raise InvalidArgument(
            f"{at}.source.format", f"must be one of {', '.join(SOURCE_FORMATS)}, got {fmt!r}"
        )
    env = _table(raw, "environment", at)
    image = typed_field(env, "image", str, f"{at}.environment", "")
    dockerfile = typed_field(env, "dockerfile", str, f"{at}.environment", "")
    if not image:
        raise InvalidArgument(f"{at}.environment.image", "is required: the OCI image the task runs in")
    workdir = typed_field(env, "workdir", str, f"{at}.environment", "/testbed")
    if not workdir.startswith("/"):
        raise InvalidArgument(f"{at}.environment.workdir", f"must be an absolute path, got {workdir!r}")
    limits = ContainerLimits(
        cpus=typed_field(env, "cpus", float, f"{at}.environment", 1.0),
        memory_mb=typed_field(env, "memory_mb", int, f"{at}.environment", 4096),
        storage_mb=typed_field(env, "storage_mb", int, f"{at}.environment", 10240),
    )
    limits.validate(f"{at}.environment")
    grading = _table(raw, "grading", at)
    g_at = f"{at}.grading"
    test_command = typed_field(grading, "test_command", str, g_at)
    if not test_command.strip():
        raise InvalidArgument(f"{g_at}.test_command", "must not be blank")
    common: dict[str, Any] = {
        "name": name,
        "family": family,
        "prompt": prompt,
        "folder": folder,
        "grader_timeout_s": timeout,
        "source_format": fmt,
        "source_id": typed_field(source, "id", str, f"{at}.source", name),
        "repo": typed_field(source, "repo", str, f"{at}.source", ""),
        "base_commit": typed_field(source, "base_commit", str, f"{at}.source", ""),
        "image": image,
        "dockerfile": dockerfile,
        "workdir": workdir,
        "limits": limits,
        "test_command": test_command,
    }
    if family == "harbor":
        tests_dir = typed_field(grading, "tests_dir", str, g_at, "hidden/tests")
        if not tests_dir.startswith("hidden/") or ".." in tests_dir.split("/"):
            raise InvalidArgument(f"{g_at}.tests_dir", f"must be a folder under hidden/, got {tests_dir!r}")
        rewards = typed_field(grading, "reward_files", list, g_at, list(DEFAULT_REWARD_FILES))
        if not rewards or not all(isinstance(r, str) and r.startswith("/") for r in rewards):
            raise InvalidArgument(f"{g_at}.reward_files", "must list absolute paths inside the container")
        test_timeout = typed_field(grading, "timeout_s", float, g_at, 600.0)
        if not (math.isfinite(test_timeout) and test_timeout > 0):
            raise InvalidArgument(
                f"{g_at}.timeout_s", f"must be a positive number of seconds, got {test_timeout}"
            )
        return ContainerTask(
            **common, tests_dir=tests_dir, reward_files=tuple(rewards), test_timeout_s=test_timeout
        )
    parser = typed_field(grading, "log_parser", str, g_at)
    if parser not in PARSERS:
        raise InvalidArgument(f"{g_at}.log_parser", f"must be one of {', '.join(PARSERS)}, got {parser!r}")
    f2p = _ids(grading, "fail_to_pass", g_at)
    p2p = _ids(grading, "pass_to_pass", g_at)
    if not f2p and not p2p:
        raise InvalidArgument(f"{g_at}.fail_to_pass", "fail_to_pass and pass_to_pass name no test at all")
    weights = _table(grading, "weights", g_at)
    w_f2p = typed_field(weights, "fail_to_pass", float, f"{g_at}.weights", 0.7 if p2p else 1.0)
    w_p2p = typed_field(weights, "pass_to_pass", float, f"{g_at}.weights", 0.3 if p2p else 0.0)
    if w_f2p < 0 or w_p2p < 0 or abs(w_f2p + w_p2p - 1.0) > 1e-6:
        raise InvalidArgument(
            f"{g_at}.weights", f"must be non-negative and sum to 1, got {w_f2p:g} + {w_p2p:g}"
        )
    return ContainerTask(
        **common,
        log_parser=parser,
        fail_to_pass=f2p,
        pass_to_pass=p2p,
        weight_fail_to_pass=w_f2p,
        weight_pass_to_pass=w_p2p,
    )


def read_family(folder: Path) -> str:
    """The `family` a task folder declares ("" when it has no readable task.toml)."""
    try:
        raw = tomllib.loads((folder / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ""
    family = raw.get("family", "")
    return family if isinstance(family, str) else ""


def load_container_task(folder: Path) -> ContainerTask:
    """Read and validate `folder/task.toml`, checking the grader files it names exist."""
    path = folder / "task.toml"
    try:
        raw = tomllib.loads(path.read_text())
    except OSError as exc:
        raise InvalidArgument("task", f"cannot read {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidArgument("task", f"{path} is not valid TOML: {exc}") from exc
    task = parse_container_task(raw, folder=folder.resolve(), at=str(path))
    if task.family == "swebench" and not task.test_patch.is_file():
        raise InvalidArgument(f"{path}", "hidden/test.patch does not exist (the dataset's test_patch)")
    if task.family == "harbor" and not (task.folder / task.tests_dir).is_dir():
        raise InvalidArgument(f"{path}.grading.tests_dir", f"{task.tests_dir!r} is not a folder of the task")
    return task
