"""Fill a sandbox's workspace from the task's template, from allowed sources only (shell: files, git).

Templates: empty (an empty folder), `task:<name>` (a bundled task's `workspace/`),
`taskset:<set>/<name>` (the `workspace/` of a task in a task set the runner registered,
`GYRE_RUNNER_TASK_SETS`), or a git repository (`git+<url>` or a URL ending in `.git`) under a
prefix the runner allows (`GYRE_RUNNER_TEMPLATE_URLS`). A host path is never a template: the
runner runs as root, and a workspace is handed to the sandbox user, so `/etc/ssl` (or any other
folder or archive of the host) is refused as bad input. Folders are copied with the kernel's
bounded, descriptor-based copy (no link is followed out of the template).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gyre.errors import InvalidArgument
from gyre.sandbox.trees import CopyBounds, CopyRefused, bounded_copy

GIT_TIMEOUT_S = 300.0
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
FIELD = "workspace_template"


class WorkspaceError(Exception):
    """The template could not be turned into a workspace; the message names the cause."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TemplateSources:
    """Where templates may come from."""

    tasks_dir: Path
    task_sets: Mapping[str, Path] = field(default_factory=dict)
    template_urls: Sequence[str] = ()


def resolve(template: str, sources: TemplateSources) -> tuple[str, str]:
    """(kind, what to fill from): a folder for `task`/`taskset`, a URL for `git`; InvalidArgument
    naming `workspace_template` for anything else.

    Example:
        resolve("task:wordfreq", TemplateSources(tasks_dir=Path("/t"))) -> ("task", "/t/wordfreq/workspace")
        resolve("/etc/ssl", ...) -> InvalidArgument("workspace_template: ... a host path is never ...")
    """
    if not template:
        return "empty", ""
    if template.startswith("task:"):
        name = template.removeprefix("task:")
        _name(name, "bundled task")
        return "task", str(sources.tasks_dir / name / "workspace")
    if template.startswith("taskset:"):
        set_name, _, name = template.removeprefix("taskset:").partition("/")
        if set_name not in sources.task_sets:
            known = ", ".join(sorted(sources.task_sets)) or "none registered"
            raise InvalidArgument(FIELD, f"unknown task set {set_name!r} (known: {known})")
        _name(name, "task")
        return "taskset", str(sources.task_sets[set_name] / name / "workspace")
    if template.startswith("git+") or template.endswith(".git"):
        url = template.removeprefix("git+")
        if not any(url.startswith(p) for p in sources.template_urls if p):
            raise InvalidArgument(
                FIELD, f"git URL {url!r} is not under an allowed prefix (GYRE_RUNNER_TEMPLATE_URLS)"
            )
        return "git", url
    raise InvalidArgument(
        FIELD,
        f"must be empty, task:<name>, taskset:<set>/<name> or an allowed git URL; got {template!r} "
        "(a host path is never a workspace template)",
    )


def _name(name: str, what: str) -> None:
    if not NAME_RE.fullmatch(name):
        raise InvalidArgument(FIELD, f"bad {what} name {name!r}")


def check_template(template: str, sources: TemplateSources) -> None:
    """Checks done before accepting a request: an unknown source or a missing task is bad input."""
    kind, where = resolve(template, sources)
    if kind in ("task", "taskset") and not Path(where).is_dir():
        raise InvalidArgument(FIELD, f"{template!r} has no workspace folder")


def fill(template: str, dest: Path, sources: TemplateSources, *, bounds: CopyBounds) -> str:
    """Copy the template into `dest` (an existing empty folder); returns the kind used."""
    try:
        kind, where = resolve(template, sources)
    except InvalidArgument as exc:
        raise WorkspaceError(str(exc)) from exc
    try:
        if kind in ("task", "taskset"):
            if not Path(where).is_dir():
                raise WorkspaceError(f"{FIELD}: {template!r} has no workspace folder (missing)")
            bounded_copy(Path(where), dest, bounds)
        elif kind == "git":
            _clone(where, dest)
    except CopyRefused as exc:
        raise WorkspaceError(f"{FIELD} {template!r}: {exc}") from exc
    except OSError as exc:
        raise WorkspaceError(f"{FIELD} {template!r}: {type(exc).__name__}: {exc}") from exc
    return kind


def _clone(url: str, dest: Path) -> None:
    try:
        done = subprocess.run(
            ["git", "clone", "--depth", "1", "--quiet", "--no-local", "--", url, str(dest)],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env={
                "PATH": os.environ.get("PATH", os.defpath),
                "GIT_TERMINAL_PROMPT": "0",
                "GIT_ALLOW_PROTOCOL": "https:ssh",  # never file:// (a host path) or ext::
            },
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkspaceError(f"{FIELD}: git clone of {url!r} took over {GIT_TIMEOUT_S:.0f} s") from exc
    if done.returncode != 0:
        raise WorkspaceError(f"{FIELD}: git clone of {url!r} failed: {done.stderr.strip()[:500]}")
