"""Write a generated task set to a folder, all or nothing (shell: files).

Layout: `DIR/<task name>/{task.toml, workspace/, hidden/}` for every instance, and
`DIR/taskset.json` naming the seed, the families and the `train` / `heldout` splits. The set is
written into a temporary sibling folder and renamed into place, so an interrupted or failed
run leaves nothing behind, and every task is loaded back through the evaluator's own
`load_task` before the rename.
"""

from __future__ import annotations

import json
from pathlib import Path

from gyre.errors import InvalidArgument
from services.evaluator.generate.families import PlannedTask, build
from services.evaluator.generate.instance import SOLUTION_FILE, solution_json, task_toml
from services.evaluator.taskset import load_task
from services.evaluator.taskset_staging import MANIFEST, write_staged


def _write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def write_taskset(out: Path, tasks: list[PlannedTask], *, seed: int) -> dict[str, object]:
    """Generate and write `tasks`; returns the manifest. Refuses a non-empty or unwritable `out`."""

    def fill(staging: Path) -> dict[str, object]:
        for planned in tasks:
            inst = build(planned, seed=seed)
            folder = staging / inst.name
            (folder / "workspace").mkdir(parents=True)
            _write_files(folder / "workspace", dict(inst.workspace))
            _write_files(
                folder,
                dict(inst.hidden) | {SOLUTION_FILE: solution_json(inst.solution, delegate=inst.delegate)},
            )
            for rel in inst.hidden:
                if rel.endswith(".sh"):
                    (folder / rel).chmod(0o755)
            (folder / "task.toml").write_text(task_toml(inst))
            load_task(str(folder))  # the evaluator must accept what was written
        return {
            "format": 1,
            "seed": seed,
            "families": sorted({t.family for t in tasks}),
            "splits": {s: [t.name for t in tasks if t.split == s] for s in ("train", "heldout")},
        }

    return write_staged(out, fill, field="out")


def load_split(root: Path, split: str) -> list[str]:
    """The task names of one split of a written set (`train` or `heldout`)."""
    path = root / MANIFEST
    if not path.is_file():
        raise InvalidArgument("tasks", f"no {MANIFEST} in {root}: not a generated task set")
    splits = json.loads(path.read_text())["splits"]
    if split not in splits:
        raise InvalidArgument("split", f"unknown split {split!r}: expected one of {', '.join(splits)}")
    return list(splits[split])
