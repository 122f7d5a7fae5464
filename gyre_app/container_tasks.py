"""Task specs for container tasks: one imported task folder or a whole imported task set (shell).

`gyre submit --task DIR` takes a folder `gyre tasks import` wrote: a task folder of the
`swebench` or `harbor` family, or a task set (its `taskset.json`; the `train` split is
submitted, one group per task). Every task is checked before anything is submitted: its
task.toml must parse and its image must be in the local container store, so a missing image is
refused here, naming the task and the field, never discovered later as a failed execution.
"""

from __future__ import annotations

import json
from pathlib import Path

from gyre.errors import InvalidArgument
from gyre.scheduler.v1 import scheduler_pb2
from gyre_app.images import image_exists
from services.evaluator.container_task import CONTAINER_FAMILIES, load_container_task, read_family
from services.scheduler.runnable import TASK_LABEL


def is_container_source(path: Path) -> bool:
    """A container task folder, or a task set folder (`taskset.json`) of them."""
    return (path / "taskset.json").is_file() or read_family(path) in CONTAINER_FAMILIES


def container_specs(
    path: Path, *, group_size: int, timeout_s: float, harness: str
) -> list[scheduler_pb2.TaskSpec]:
    folders = _task_folders(path)
    specs = []
    for folder in folders:
        task = load_container_task(folder)
        if not image_exists(task.image):
            raise InvalidArgument(
                f"{folder / 'task.toml'}: environment.image",
                f"image {task.image!r} of task {task.name!r} is not in the local container store "
                "(build or pull it first)",
            )
        specs.append(
            scheduler_pb2.TaskSpec(
                name=task.name,
                family=task.family,
                prompt=task.prompt,
                group_size=group_size,
                timeout_s=timeout_s,
                harness=harness,
                # No template: the workspace is the image's own checkout. The label names the task
                # folder the runner starts the image from and the evaluator grades with.
                labels={TASK_LABEL: str(folder.resolve())},
            )
        )
    return specs


def _task_folders(path: Path) -> list[Path]:
    manifest = path / "taskset.json"
    if not manifest.is_file():
        return [path]
    try:
        names = json.loads(manifest.read_text())["splits"]["train"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidArgument(str(manifest), f"must hold splits.train, a list of task names: {exc}") from exc
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise InvalidArgument(f"{manifest}: splits.train", "must list at least one task name")
    return [path / name for name in names]
