"""Write imported tasks to a folder, all or nothing (shell: files).

Layout (docs/datasets.md, "Importing a dataset"): `OUT/<name>/{task.toml, hidden/, environment/}`
per task and `OUT/taskset.json` as `gyre tasks generate` writes it, every task in the `train`
split. The set is written into a temporary sibling folder and renamed into place, so an
interrupted or failed run leaves nothing behind; each task.toml is read back and compared
before the rename.
"""

from __future__ import annotations

import shutil
import tomllib
from collections.abc import Sequence
from pathlib import Path

from gyre.errors import InvalidArgument
from services.evaluator.imports.imported import ImportedTask, Refusal
from services.evaluator.imports.toml_text import render
from services.evaluator.taskset_staging import write_staged


def dedupe(results: Sequence[ImportedTask | Refusal]) -> list[ImportedTask | Refusal]:
    """A second instance whose task name is taken is refused (ids that differ only in case or
    punctuation map to one name); the first stays."""
    seen: dict[str, str] = {}
    out: list[ImportedTask | Refusal] = []
    for r in results:
        if isinstance(r, ImportedTask) and r.name in seen:
            taken = seen[r.name]
            why = (
                f"is a duplicate of {taken!r}"
                if taken == r.instance_id
                else f"maps to {r.name!r} as {taken!r} does"
            )
            out.append(Refusal(id=r.instance_id, field="id", why=why))
            continue
        if isinstance(r, ImportedTask):
            seen[r.name] = r.instance_id
        out.append(r)
    return out


def write_tasks(out: Path, tasks: Sequence[ImportedTask], *, source: str) -> dict[str, object]:
    """Write `tasks` and the manifest into `out`; returns the manifest."""

    def fill(staging: Path) -> dict[str, object]:
        for task in tasks:
            _write_task(staging / task.name, task)
        return {
            "format": 1,
            "seed": None,
            "families": sorted({t.family for t in tasks}),
            "splits": {"train": [t.name for t in tasks], "heldout": []},
            "source": source,
        }

    return write_staged(out, fill, field="--out")


def _write_task(folder: Path, task: ImportedTask) -> None:
    folder.mkdir(parents=True)
    text = render(task.toml_tables())
    if tomllib.loads(text) != task.toml_tables():  # the renderer covers what importers produce
        raise InvalidArgument(task.instance_id, "its task.toml would not read back as written")
    (folder / "task.toml").write_text(text)
    (folder / "hidden").mkdir()
    for rel, body in task.files.items():
        _inside(folder, rel).write_text(body)
    root = Path(task.copy_root)
    for rel, src in task.copies.items():
        source_path = root / src
        if source_path.is_symlink() or not source_path.is_file():  # changed since it was listed
            raise InvalidArgument(task.instance_id, f"{src} is no longer a regular file")
        shutil.copyfile(source_path, _inside(folder, rel))
        mode = source_path.stat().st_mode
        _inside(folder, rel).chmod(0o755 if mode & 0o111 else 0o644)


def _inside(folder: Path, rel: str) -> Path:
    path = folder / rel
    assert ".." not in Path(rel).parts and not Path(rel).is_absolute(), rel
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
