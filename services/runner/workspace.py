"""Fill a sandbox's workspace from the task's template (shell: files, git, archives).

Templates: empty (an empty folder), `task:<name>` (a bundled task's `workspace/`), a folder path,
an archive (`.tar`, `.tar.gz`, `.tgz`, `.zip`) or a git repository (`git+<url>` or a URL ending
in `.git`). Archives are unpacked without links leaving the folder or absolute paths.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from gyre.errors import InvalidArgument

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
GIT_TIMEOUT_S = 300.0


class WorkspaceError(Exception):
    """The template could not be turned into a workspace; the message names the cause."""


def template_kind(template: str) -> str:
    """Which kind of template this is.

    Example:
        template_kind("task:wordfreq") -> "task";  template_kind("https://x/y.git") -> "git"
    """
    if not template:
        return "empty"
    if template.startswith("task:"):
        return "task"
    if template.startswith("git+") or template.endswith(".git"):
        return "git"
    if template.endswith(ARCHIVE_SUFFIXES):
        return "archive"
    return "folder"


def fill(template: str, dest: Path, *, tasks_dir: Path) -> str:
    """Copy the template into `dest` (an existing empty folder); returns the kind used."""
    kind = template_kind(template)
    try:
        if kind == "task":
            name = template.removeprefix("task:")
            if not name or "/" in name or name.startswith("."):
                raise WorkspaceError(f"workspace_template: bad bundled task name {name!r}")
            _copy_folder(tasks_dir / name / "workspace", dest, what=f"bundled task {name!r}")
        elif kind == "folder":
            _copy_folder(Path(template), dest, what="template folder")
        elif kind == "archive":
            _unpack(Path(template), dest)
        elif kind == "git":
            _clone(template.removeprefix("git+"), dest)
    except OSError as exc:
        raise WorkspaceError(f"workspace_template {template!r}: {type(exc).__name__}: {exc}") from exc
    return kind


def _copy_folder(src: Path, dest: Path, *, what: str) -> None:
    if not src.is_dir():
        raise WorkspaceError(f"workspace_template: {what} {str(src)!r} is not a folder")
    shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)


def _unpack(archive: Path, dest: Path) -> None:
    if not archive.is_file():
        raise WorkspaceError(f"workspace_template: archive {str(archive)!r} does not exist")
    if archive.suffix == ".zip":
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                target = (dest / member).resolve()
                if dest.resolve() not in target.parents and target != dest.resolve():
                    raise WorkspaceError(
                        f"workspace_template: archive member {member!r} leaves the workspace"
                    )
            zf.extractall(dest)
        return
    try:
        with tarfile.open(archive) as tf:
            tf.extractall(dest, filter="data")  # refuses absolute paths, `..` and links outside
    except tarfile.TarError as exc:
        raise WorkspaceError(f"workspace_template: archive {str(archive)!r}: {exc}") from exc


def _clone(url: str, dest: Path) -> None:
    try:
        done = subprocess.run(
            ["git", "clone", "--depth", "1", "--quiet", url, str(dest)],
            capture_output=True,
            text=True,
            timeout=GIT_TIMEOUT_S,
            env={"PATH": os.environ.get("PATH", os.defpath), "GIT_TERMINAL_PROMPT": "0"},
        )
    except subprocess.TimeoutExpired as exc:
        raise WorkspaceError(
            f"workspace_template: git clone of {url!r} took over {GIT_TIMEOUT_S:.0f} s"
        ) from exc
    if done.returncode != 0:
        raise WorkspaceError(f"workspace_template: git clone of {url!r} failed: {done.stderr.strip()[:500]}")


def check_template(template: str, *, tasks_dir: Path) -> None:
    """Cheap checks done before accepting a request: a missing local template is bad input."""
    kind = template_kind(template)
    if kind == "task" and not (tasks_dir / template.removeprefix("task:") / "workspace").is_dir():
        raise InvalidArgument(
            "workspace_template", f"no bundled task {template.removeprefix('task:')!r} in {tasks_dir}"
        )
    if kind == "folder" and not Path(template).is_dir():
        raise InvalidArgument("workspace_template", f"folder {template!r} does not exist")
    if kind == "archive" and not Path(template).is_file():
        raise InvalidArgument("workspace_template", f"archive {template!r} does not exist")
