"""Harbor (Terminal-Bench) task folders into Gyre task folders (pure).

A Harbor task folder holds `task.toml` (`[verifier] timeout_sec`, `[environment]` with
`docker_image`, `cpus`, `memory_mb` or `memory = "2G"`, `storage_mb`), `instruction.md` (the
prompt), `environment/` (a Dockerfile, unless `docker_image` names a built image), `tests/`
(`test.sh` writes the reward to /logs/verifier/reward.txt or reward.json) and `solution/`.
`sources` reads a folder into a `HarborFolder`; this module decides what is written: the
environment is copied as it is, the tests and solution go under `hidden/`. A task that builds
its own image gets `image = "localhost/gyre-harbor/<name>:latest"`, the tag to build it under.

Example:
    HarborFolder(name="hello", root="/data/hello", task_toml="[verifier]\\ntimeout_sec = 60\\n",
                 instruction="Say hi", dockerfile="FROM debian\\nWORKDIR /app\\n",
                 files=("task.toml", "instruction.md", "environment/Dockerfile", "tests/test.sh"))
    -> ImportedTask(name="hello", family="harbor", environment={"dockerfile": "environment/Dockerfile",
       "workdir": "/app", ...}, copies={"environment/Dockerfile": "environment/Dockerfile",
       "hidden/tests/test.sh": "tests/test.sh"}, ...)
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from typing import Any

from services.evaluator.imports.imported import (
    DEFAULT_STORAGE_MB,
    ImportedTask,
    Refusal,
    environment_table,
    task_name,
)
from services.evaluator.imports.row_fields import RowError

DEFAULT_WORKDIR = "/app"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0  # Harbor's own default
DEFAULT_MEMORY_MB = 2048  # Harbor's own default
REWARD_FILES = ["/logs/verifier/reward.txt", "/logs/verifier/reward.json"]
_WORKDIR_RE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.IGNORECASE | re.MULTILINE)
# where each of the folder's parts goes in the imported folder
_PLACES = {"environment/": "environment/", "tests/": "hidden/tests/", "solution/": "hidden/solution/"}


@dataclass(frozen=True, slots=True, kw_only=True)
class HarborFolder:
    """What `sources` read of one Harbor task folder."""

    name: str
    """The folder's name."""
    root: str
    """The folder's path, which the writer copies from."""
    task_toml: str | None
    instruction: str | None
    dockerfile: str | None
    files: tuple[str, ...]
    """Every regular file, relative to the folder."""


def import_harbor_folder(folder: HarborFolder) -> ImportedTask | Refusal:
    """One folder into a task, or a refusal naming the folder and the part at fault."""
    try:
        return _task(folder)
    except RowError as err:
        return Refusal(id=folder.name, field=err.field, why=err.why)


def _task(folder: HarborFolder) -> ImportedTask:
    if folder.task_toml is None:
        raise RowError("task.toml", "is missing")
    try:
        config = tomllib.loads(folder.task_toml)
    except tomllib.TOMLDecodeError as exc:
        raise RowError("task.toml", f"is not valid TOML: {exc}") from None
    if folder.instruction is None or not folder.instruction.strip():
        raise RowError("instruction.md", "is missing or blank: it is the task's prompt")
    if "tests/test.sh" not in folder.files:
        raise RowError("tests", "tests/test.sh is missing: nothing would grade the task")
    verifier = _table(config, "verifier")
    timeout_s = _number(verifier, "timeout_sec", "verifier", DEFAULT_VERIFIER_TIMEOUT_S)
    if not 0 < timeout_s <= 3600:
        raise RowError("verifier.timeout_sec", f"must be in (0, 3600], got {timeout_s:g}")
    env = _table(config, "environment")
    image = env.get("docker_image") or ""
    if not isinstance(image, str):
        raise RowError("environment.docker_image", "must be an image name")
    dockerfile = "environment/Dockerfile" if "environment/Dockerfile" in folder.files else ""
    if not image and not dockerfile:
        raise RowError("environment", "has no Dockerfile and task.toml names no docker_image")
    package = config.get("task")
    own_name = package.get("name") if isinstance(package, dict) else None
    instance_id = own_name if isinstance(own_name, str) and own_name.strip() else folder.name
    name = task_name(instance_id)
    return ImportedTask(
        name=name,
        family="harbor",
        prompt=folder.instruction,
        grader_timeout_s=timeout_s,
        source={"format": "harbor", "id": instance_id},
        environment=environment_table(
            image=image or built_image(name),
            dockerfile=dockerfile,
            workdir=_workdir(folder.dockerfile if dockerfile else None),
            cpus=_number(env, "cpus", "environment", 1.0),
            memory_mb=_megabytes(env, "memory", DEFAULT_MEMORY_MB),
            storage_mb=_megabytes(env, "storage", DEFAULT_STORAGE_MB),
        ),
        grading={
            "tests_dir": "hidden/tests",
            "test_command": "bash /tests/test.sh",
            "reward_files": REWARD_FILES,
            "timeout_s": timeout_s,
        },
        copies={
            _PLACES[part] + path.removeprefix(part): path
            for path in folder.files
            for part in _PLACES
            if path.startswith(part)
        },
        copy_root=folder.root,
    )


def built_image(name: str) -> str:
    """The local tag a task's own Dockerfile is built under (no registry holds it).

    Example: built_image("hello-file") -> "localhost/gyre-harbor/hello-file:latest"
    """
    return f"localhost/gyre-harbor/{name}:latest"


def _table(config: dict[str, Any], key: str) -> dict[str, Any]:
    table = config.get(key, {})
    if not isinstance(table, dict):
        raise RowError(key, "must be a table")
    return table


def _number(table: dict[str, Any], key: str, at: str, default: float) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(f"{at}.{key}", f"must be a number, got {value!r}")
    if value <= 0:
        raise RowError(f"{at}.{key}", f"must be above 0, got {value!r}")
    return float(value)


def _megabytes(env: dict[str, Any], kind: str, default: int) -> int:
    """`memory_mb = 2048`, or the older `memory = "2G"` (also "512M")."""
    if f"{kind}_mb" in env:
        return int(_number(env, f"{kind}_mb", "environment", default))
    size = env.get(kind)
    if size is None:
        return default
    match = re.fullmatch(r"\s*([\d.]+)\s*([GMK])B?\s*", str(size), re.IGNORECASE)
    if not match:
        raise RowError(f"environment.{kind}", f"must be like '2G' or '512M', got {size!r}")
    scale = {"G": 1024.0, "M": 1.0, "K": 1 / 1024}[match.group(2).upper()]
    megabytes = int(float(match.group(1)) * scale)
    if megabytes <= 0:
        raise RowError(f"environment.{kind}", f"must be above 0, got {size!r}")
    return megabytes


def _workdir(dockerfile: str | None) -> str:
    """The Dockerfile's last WORKDIR (where Harbor's agent and tests start), else /app."""
    found = _WORKDIR_RE.findall(dockerfile or "")
    return found[-1] if found and found[-1].startswith("/") else DEFAULT_WORKDIR
