"""Read back the steps each tracker sink holds, with each library's own reader (shell: files).

For checking a run's tracking (`bench.workflow`, the sink tests): `logged_steps` answers, per
sink, the step of every row it stored, in order, so "exactly one row per step" is a comparison.
W&B's offline file is read directly: its reader lives in W&B's Go core, and the format is a
LevelDB-style log of protobuf `Record`s in 32 KiB blocks after a 7-byte header.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from pathlib import Path

from gyre_app.track_sinks import ROWS_FILE

PROBE = "train/loss"
"""A scalar every row has (the trainer's loss is in every `StepCompleted`)."""
WANDB_BLOCK = 32768


def jsonl_steps(folder: Path) -> list[int]:
    path = folder / ROWS_FILE
    return [int(json.loads(line)["step"]) for line in path.read_text().splitlines()] if path.exists() else []


def tensorboard_steps(folder: Path, key: str = PROBE) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # type: ignore[import-untyped]

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()
    return [e.step for e in events.Scalars(key)] if key in events.Tags()["scalars"] else []


def mlflow_steps(folder: Path, project: str, key: str = PROBE) -> list[int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{(folder / 'mlflow.db').resolve()}")
    experiment = client.get_experiment_by_name(project)
    if experiment is None:
        return []
    steps: list[int] = []
    for run in client.search_runs([experiment.experiment_id]):
        steps += [m.step for m in client.get_metric_history(run.info.run_id, key)]
    return sorted(steps)


def wandb_steps(folder: Path, key: str = PROBE) -> list[int]:
    """Steps of the history records holding `key` in the offline run under `folder`."""
    from wandb.proto import wandb_internal_pb2

    steps: list[int] = []
    for path in sorted(folder.glob("wandb/offline-run-*/run-*.wandb")):
        data = path.read_bytes()
        pos, buf = 7, b""
        while pos + 7 <= len(data):
            left = WANDB_BLOCK - pos % WANDB_BLOCK
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if left < 7 or kind == 0:  # the block's padding
                pos += left
                continue
            buf += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):  # a whole record, or the last piece of one
                record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
                record.ParseFromString(buf)
                buf = b""
                if record.WhichOneof("record_type") != "history":
                    continue
                keys = {item.key or "/".join(item.nested_key) for item in record.history.item}
                if key in keys:
                    steps.append(record.history.step.num)
    return steps


def trackio_steps(project: str, run_name: str, key: str = PROBE) -> list[int]:
    """Trackio's store is where TRACKIO_DIR pointed when trackio was first imported."""
    from trackio.sqlite_storage import SQLiteStorage

    return [int(r["step"]) for r in SQLiteStorage.get_logs(project, run_name) if key in r]


def logged_steps(folder: Path, sinks: Sequence[str], *, project: str, run_name: str) -> dict[str, list[int]]:
    readers = {
        "jsonl": lambda: jsonl_steps(folder),
        "tensorboard": lambda: tensorboard_steps(folder),
        "mlflow": lambda: mlflow_steps(folder, project),
        "wandb": lambda: wandb_steps(folder),
        "trackio": lambda: trackio_steps(project, run_name),
    }
    return {name: readers[name]() for name in sinks}
