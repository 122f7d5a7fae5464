"""Read a SOURCE path: a JSON-lines / JSON file of rows, or Harbor task folders (shell: files).

`--format auto` decides by what it finds: a folder holds Harbor tasks (itself one, or one per
subfolder); a file holds rows, each an R2E-Gym row when it has `expected_output_json` or
`parsed_commit_content`, else a SWE-bench-family row (`swebench_rows.flavour_of` tells which).
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gyre.errors import InvalidArgument
from services.evaluator.imports.harbor_folders import HarborFolder, import_harbor_folder
from services.evaluator.imports.imported import ImportedTask, Refusal
from services.evaluator.imports.r2e_rows import import_r2e_row
from services.evaluator.imports.swebench_rows import FLAVOURS, import_swebench_row

FORMATS = ("auto", "harbor", "swebench", "swegym", "swesmith", "r2e")
MAX_FILES = 10_000  # per Harbor folder: a task folder, not a disk


def import_source(source: Path, fmt: str = "auto") -> list[ImportedTask | Refusal]:
    """Every instance of `source`, imported or refused, in the source's order."""
    if fmt not in FORMATS:
        raise InvalidArgument("--format", f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    if not source.exists():
        raise InvalidArgument("SOURCE", f"{source} does not exist")
    if source.is_dir():
        if fmt not in ("auto", "harbor"):
            raise InvalidArgument("SOURCE", f"{source} is a folder; --format {fmt} reads a JSON-lines file")
        return [_harbor(d) for d in harbor_task_folders(source)]
    if fmt == "harbor":
        raise InvalidArgument("SOURCE", f"{source} is a file; --format harbor reads task folders")
    out: list[ImportedTask | Refusal] = []
    for row in read_rows(source):
        if isinstance(row, Refusal):
            out.append(row)
        elif fmt == "r2e" or (fmt == "auto" and is_r2e_row(row)):
            out.append(import_r2e_row(row))
        else:
            out.append(import_swebench_row(row, flavour=fmt if fmt in FLAVOURS else None))
    return out


def _harbor(folder: Path) -> ImportedTask | Refusal:
    read = read_harbor_folder(folder)
    return read if isinstance(read, Refusal) else import_harbor_folder(read)


def is_r2e_row(row: dict[str, Any]) -> bool:
    return "expected_output_json" in row or "parsed_commit_content" in row


def read_rows(path: Path) -> Iterator[dict[str, Any] | Refusal]:
    """Rows of a JSON-lines file, or of a JSON file holding a list of rows; a line that is not
    a JSON object is refused by its line number, the others still read."""
    try:
        body = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidArgument("SOURCE", f"cannot read {path}: {exc}") from None
    if body.lstrip().startswith("["):
        try:
            rows = json.loads(body)
        except ValueError as exc:
            raise InvalidArgument("SOURCE", f"{path} is not a JSON list of rows: {exc}") from None
        for i, row in enumerate(rows):
            yield _row(f"row {i}", row)
        return
    for n, line in enumerate(body.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            yield Refusal(id=f"line {n}", field="line", why=f"is not JSON: {exc}")
            continue
        yield _row(f"line {n}", row)


def _row(where: str, row: Any) -> dict[str, Any] | Refusal:
    if not isinstance(row, dict):
        return Refusal(id=where, field="line", why=f"must be a JSON object, got {type(row).__name__}")
    return row


def harbor_task_folders(root: Path) -> list[Path]:
    """`root` itself when it is one task, else its subfolders that look like tasks, by name.

    A subfolder counts when it has a task.toml or an instruction.md, so one missing the other
    is still refused by name rather than skipped. Gyre's own task folders (a task.toml with a
    `family`) are not Harbor tasks and are refused as such.
    """
    if _looks_like_task(root):
        return [root]
    found = sorted(d for d in root.iterdir() if d.is_dir() and not d.is_symlink() and _looks_like_task(d))
    if not found:
        raise InvalidArgument("SOURCE", f"{root} holds no Harbor task folder (task.toml + instruction.md)")
    return found


def _looks_like_task(folder: Path) -> bool:
    return (folder / "task.toml").is_file() or (folder / "instruction.md").is_file()


def read_harbor_folder(folder: Path) -> HarborFolder | Refusal:
    """What the pure importer needs of one folder: its texts and its list of regular files.

    A link or special file anywhere in it is refused (copying a link could copy host files into
    a task), and so is a Gyre task.toml.
    """
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(folder):
        for entry in sorted(dirnames + filenames):
            path = Path(dirpath) / entry
            mode = path.lstat().st_mode
            rel = path.relative_to(folder).as_posix()
            if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                return Refusal(id=folder.name, field=rel, why="is a link or special file: regular files only")
            if stat.S_ISREG(mode):
                files.append(rel)
        if len(files) > MAX_FILES:
            return Refusal(id=folder.name, field="folder", why=f"holds more than {MAX_FILES} files")
    task_toml = _text(folder / "task.toml")
    if task_toml is not None and _is_gyre_task(task_toml):
        return Refusal(
            id=folder.name, field="task.toml", why="is Gyre's own task format: use the folder as it is"
        )
    return HarborFolder(
        name=folder.name,
        root=str(folder.resolve()),
        task_toml=task_toml,
        instruction=_text(folder / "instruction.md"),
        dockerfile=_text(folder / "environment" / "Dockerfile"),
        files=tuple(sorted(files)),
    )


def _text(path: Path) -> str | None:
    """A file's text, or None when it is absent; undecodable text reads with replacements."""
    if not path.is_file():
        return None
    return path.read_bytes().decode("utf-8", errors="replace")


def _is_gyre_task(task_toml: str) -> bool:
    try:
        raw = tomllib.loads(task_toml)
    except tomllib.TOMLDecodeError:
        return False
    return isinstance(raw.get("family"), str) and "name" in raw
