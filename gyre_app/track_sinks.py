"""Tracker sinks: where step rows and sample tables go (shell: files and tracking libraries).

A sink has three methods: `log_row(row)`, `log_samples(step, samples)` and `close()`. Gyre has
five: a JSONL file (on by default), TensorBoard, W&B (offline unless `WANDB_MODE` says online),
MLflow (a local SQLite store unless `MLFLOW_TRACKING_URI` names a server) and Trackio (a local
SQLite store under the run's folder unless `TRACKIO_DIR` says elsewhere). The libraries are
optional: `parse_sinks` refuses an unknown name, or one whose package is not installed, with the
package and the command that installs it, before anything starts.

`Tracker` fans each call out to every sink; a sink that raises is logged and counted
(`failures`), and the others go on: a tracking outage never stops the run.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import structlog

from gyre.errors import InvalidArgument
from gyre_app.track_rows import HISTOGRAM_EDGES, StepRow

log = structlog.get_logger(__name__)

OPTIONAL_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""Sink name -> the Python package it needs (`jsonl` needs none)."""
SINK_NAMES = ("jsonl", *OPTIONAL_PACKAGES)
INSTALL_HINT = "pip install 'gyre[track]' (all of them) or pip install {package}"
ROWS_FILE = "steps.jsonl"
SAMPLES_FILE = "samples.jsonl"


class Sink(Protocol):
    name: str

    def log_row(self, row: StepRow) -> None: ...

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None: ...

    def close(self) -> None: ...


def parse_sinks(text: str, *, field_name: str = "--track") -> tuple[str, ...]:
    """Sink names from `jsonl,tensorboard`; `none` or empty: none. Refuses unknown names and
    missing packages (the message names the package and how to install it).

    Example: "wandb, tensorboard,wandb" -> ("wandb", "tensorboard")
    """
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    if names == ["none"]:
        return ()
    out: list[str] = []
    for name in names:
        if name not in SINK_NAMES:
            raise InvalidArgument(
                field_name, f"unknown tracker {name!r}; known: {', '.join(SINK_NAMES)}, or none"
            )
        package = OPTIONAL_PACKAGES.get(name)
        if package is not None and importlib.util.find_spec(package) is None:
            raise InvalidArgument(
                field_name,
                f"the {name} tracker needs the Python package {package!r}, which is not installed: "
                + INSTALL_HINT.format(package=package),
            )
        if name not in out:
            out.append(name)
    return tuple(out)


@dataclass(slots=True)
class JsonlSink:
    """`steps.jsonl` (one object per step: `step`, the scalars, `reward_histogram`) and
    `samples.jsonl` (one object per sample execution), appended and flushed per call."""

    folder: Path
    name: str = "jsonl"

    def log_row(self, row: StepRow) -> None:
        record = {"step": row.step, **row.scalars, "reward_histogram": list(row.reward_histogram)}
        self._append(ROWS_FILE, [record])

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        self._append(SAMPLES_FILE, samples)

    def _append(self, file: str, records: Sequence[dict[str, Any]]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / file).open("a") as f:
            f.writelines(json.dumps(r, sort_keys=True) + "\n" for r in records)

    def close(self) -> None:
        pass


def _markdown_table(samples: Sequence[dict[str, Any]]) -> str:
    head = "| execution | reward | ending | turns | tool calls |\n|---|---|---|---|---|\n"
    lines = [
        f"| {s['execution_id']} | {s['reward']} | {s['ending']} | {s['turns']} | "
        + ", ".join(t["name"] for t in s["tool_calls"])
        + " |"
        for s in samples
    ]
    return head + "\n".join(lines)


@dataclass(slots=True)
class TensorBoardSink:
    """Event files under `<folder>/tensorboard`: the scalars, and the samples as a text table."""

    folder: Path
    name: str = "tensorboard"
    writer: Any = None

    def __post_init__(self) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(self.folder / "tensorboard"))

    def log_row(self, row: StepRow) -> None:
        for key, value in row.flat().items():
            self.writer.add_scalar(key, value, global_step=row.step)
        self.writer.flush()

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        self.writer.add_text("samples", _markdown_table(samples), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


SAMPLE_COLUMNS = ("step", "execution_id", "task_id", "reward", "ending", "turns", "prompt", "tool_calls")


def _table_rows(samples: Sequence[dict[str, Any]]) -> list[list[Any]]:
    return [[json.dumps(s[c]) if c == "tool_calls" else s[c] for c in SAMPLE_COLUMNS] for s in samples]


@dataclass(slots=True)
class WandbSink:
    """A W&B run under `<folder>/wandb`, offline unless WANDB_MODE is set (`wandb sync` uploads it)."""

    folder: Path
    project: str
    run_name: str
    name: str = "wandb"
    run: Any = None

    def __post_init__(self) -> None:
        import os

        import wandb

        (self.folder / "wandb").mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(
            project=self.project,
            name=self.run_name,
            dir=str(self.folder),
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
        )

    def log_row(self, row: StepRow) -> None:
        import numpy as np
        import wandb

        payload: dict[str, Any] = dict(row.scalars)
        if row.reward_histogram:  # the last bin holds exactly 1.0: W&B wants an edge past it
            edges = np.array([*HISTOGRAM_EDGES, HISTOGRAM_EDGES[-1] + 1e-3])
            counts = np.array(row.reward_histogram)
            payload["reward/histogram"] = wandb.Histogram(np_histogram=(counts, edges))
        self.run.log(payload, step=row.step)

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=list(SAMPLE_COLUMNS), data=_table_rows(samples))
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


@dataclass(slots=True)
class MlflowSink:
    """An MLflow run in a local SQLite store `<folder>/mlflow.db` unless MLFLOW_TRACKING_URI is set
    (MLflow 3 refuses new runs in its old `./mlruns` file store; `mlflow ui --backend-store-uri
    sqlite:///<folder>/mlflow.db` shows this one)."""

    folder: Path
    project: str
    run_name: str
    name: str = "mlflow"
    client: Any = None
    run_id: str = ""

    def __post_init__(self) -> None:
        import os

        from mlflow.tracking import MlflowClient

        self.folder.mkdir(parents=True, exist_ok=True)
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(self.folder / 'mlflow.db').resolve()}"
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(self.project)
        # Artifacts (the sample tables) beside the store, not in MLflow's default ./mlruns of the
        # process's working folder.
        artifacts = (self.folder / "mlflow-artifacts").resolve().as_uri()
        experiment_id = (
            experiment.experiment_id
            if experiment
            else self.client.create_experiment(self.project, artifact_location=artifacts)
        )
        self.run_id = self.client.create_run(experiment_id, run_name=self.run_name).info.run_id

    def log_row(self, row: StepRow) -> None:
        from mlflow.entities import Metric

        now_ms = 0  # MLflow orders a metric's points by step; the wall time is not a Gyre figure
        metrics = [Metric(key=k, value=v, timestamp=now_ms, step=row.step) for k, v in row.flat().items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        self.client.log_dict(self.run_id, list(samples), f"samples/step-{step:08d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@dataclass(slots=True)
class TrackioSink:
    """A Trackio run, stored under `<folder>/trackio` unless TRACKIO_DIR is set (`trackio show`)."""

    folder: Path
    project: str
    run_name: str
    name: str = "trackio"
    module: Any = None

    def __post_init__(self) -> None:
        import os

        os.environ.setdefault("TRACKIO_DIR", str(self.folder / "trackio"))  # read when trackio is imported
        import trackio

        self.module = trackio
        trackio.init(
            project=self.project, name=self.run_name, embed=False, auto_log_cpu=False, auto_log_gpu=False
        )

    def log_row(self, row: StepRow) -> None:
        self.module.log(row.flat(), step=row.step)

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        table = self.module.Table(columns=list(SAMPLE_COLUMNS), data=_table_rows(samples))
        self.module.log({"samples": table}, step=step)

    def close(self) -> None:
        self.module.finish()


def open_sink(name: str, folder: Path, *, project: str, run_name: str) -> Sink:
    if name == "jsonl":
        return JsonlSink(folder)
    if name == "tensorboard":
        return TensorBoardSink(folder)
    if name == "wandb":
        return WandbSink(folder, project=project, run_name=run_name)
    if name == "mlflow":
        return MlflowSink(folder, project=project, run_name=run_name)
    if name == "trackio":
        return TrackioSink(folder, project=project, run_name=run_name)
    raise InvalidArgument("sinks", f"unknown tracker {name!r}; known: {', '.join(SINK_NAMES)}")


@dataclass(slots=True)
class Tracker:
    """Every sink, each failure caught, logged and counted so the other sinks (and the run) go on."""

    sinks: list[Sink]
    failures: dict[str, int] = field(default_factory=dict)
    rows_logged: dict[str, int] = field(default_factory=dict)

    @classmethod
    def open(cls, names: Sequence[str], folder: Path, *, project: str, run_name: str) -> Tracker:
        tracker = cls(sinks=[])
        for name in names:
            try:
                tracker.sinks.append(open_sink(name, folder, project=project, run_name=run_name))
            except Exception as exc:  # a sink that cannot start is counted; the others still log
                tracker._failed(name, "open", exc)
        return tracker

    def _failed(self, name: str, what: str, exc: Exception) -> None:
        self.failures[name] = self.failures.get(name, 0) + 1
        log.warning(
            "tracker_sink_failed", sink=name, call=what, error=repr(exc), failures=self.failures[name]
        )

    def log_row(self, row: StepRow) -> None:
        for sink in self.sinks:
            try:
                sink.log_row(row)
                self.rows_logged[sink.name] = self.rows_logged.get(sink.name, 0) + 1
            except Exception as exc:  # see the class docstring
                self._failed(sink.name, "log_row", exc)

    def log_samples(self, step: int, samples: Sequence[dict[str, Any]]) -> None:
        if not samples:
            return
        for sink in self.sinks:
            try:
                sink.log_samples(step, samples)
            except Exception as exc:  # see the class docstring
                self._failed(sink.name, "log_samples", exc)

    def close(self) -> None:
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as exc:  # see the class docstring
                self._failed(sink.name, "close", exc)
