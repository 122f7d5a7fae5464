"""What one imported instance becomes, and the refusal of one that cannot be (pure).

Example:
    task_name("astropy__astropy-12907") -> "astropy__astropy-12907"
    task_name("Owner/Repo.1fd52536")    -> "owner-repo-1fd52536"
    task_name("123-fix")                -> "t-123-fix"
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.evaluator.taskset import NAME_RE

FORMATS = ("swebench", "swegym", "swesmith", "r2e", "harbor")
DEFAULT_GRADER_TIMEOUT_S = 1800.0
DEFAULT_CPUS = 1.0
DEFAULT_MEMORY_MB = 4096
DEFAULT_STORAGE_MB = 10240
_NOT_NAME = re.compile(r"[^a-z0-9_-]")


def task_name(instance_id: str) -> str:
    """The task folder's name for a dataset id (the evaluator's NAME_RE); the id itself is kept
    in `[source].id`. Ids longer than 64 keep 55 characters and 8 hex of their sha256, so two
    long ids that share a prefix still differ."""
    name = _NOT_NAME.sub("-", instance_id.lower())
    if not name[:1].isalpha() or not name[:1].isascii():
        name = "t-" + name
    if len(name) > 64:
        name = name[:55] + "-" + hashlib.sha256(instance_id.encode()).hexdigest()[:8]
    assert NAME_RE.fullmatch(name), name
    return name


@dataclass(frozen=True, slots=True, kw_only=True)
class Refusal:
    """An instance that was not imported: its id, the field at fault and what was expected."""

    id: str
    field: str
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "field": self.field, "why": self.why}


@dataclass(frozen=True, slots=True, kw_only=True)
class ImportedTask:
    """One task folder to write: `task.toml` tables plus the files that go beside it.

    `files` maps a path inside the folder to its text; `copies` maps a path inside the folder to
    a path inside the source folder (Harbor's environment/, tests/ and solution/ are copied as
    they are, bytes and executable bits included).
    """

    name: str
    family: str
    prompt: str
    grader_timeout_s: float
    source: Mapping[str, Any]
    environment: Mapping[str, Any]
    grading: Mapping[str, Any]
    files: Mapping[str, str] = field(default_factory=dict)
    copies: Mapping[str, str] = field(default_factory=dict)
    copy_root: str = ""
    """The source folder `copies` are relative to."""

    @property
    def instance_id(self) -> str:
        return str(self.source["id"])

    def toml_tables(self) -> dict[str, Any]:
        """The task.toml document, key order as written."""
        return {
            "name": self.name,
            "family": self.family,
            "prompt": self.prompt,
            "grader_timeout_s": self.grader_timeout_s,
            "source": dict(self.source),
            "environment": dict(self.environment),
            "grading": dict(self.grading),
        }


def environment_table(
    *,
    image: str,
    workdir: str,
    dockerfile: str = "",
    cpus: float = DEFAULT_CPUS,
    memory_mb: int = DEFAULT_MEMORY_MB,
    storage_mb: int = DEFAULT_STORAGE_MB,
) -> dict[str, Any]:
    return {
        "image": image,
        "dockerfile": dockerfile,
        "workdir": workdir,
        "cpus": float(cpus),
        "memory_mb": int(memory_mb),
        "storage_mb": int(storage_mb),
    }
