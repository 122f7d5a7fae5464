"""Tracker sinks: each real library holds one row per step, and a failing sink stops nothing.

The optional libraries (tensorboard, wandb, mlflow-skinny, trackio) are in the `dev` extra, so
CI runs every sink; they stay out of the default install (`gyre[track]` brings them).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.errors import InvalidArgument
from gyre.logs import configure_logging
from gyre_app.cli_track import up_sinks
from gyre_app.track_readback import logged_steps, tensorboard_steps
from gyre_app.track_rows import StepRow
from gyre_app.track_sinks import OPTIONAL_PACKAGES, SINK_NAMES, Tracker, parse_sinks

STEPS = (1, 2, 3)
SAMPLE = {
    "step": 1,
    "execution_id": "e1",
    "task_id": "t1",
    "reward": 1.0,
    "ending": "done",
    "turns": 2,
    "prompt": "fix it",
    "tool_calls": [{"name": "ls", "arguments": "{}"}],
    "last_output": "ok",
}


def row(step: int) -> StepRow:
    return StepRow(
        step=step,
        scalars={"train/loss": 1.0 / step, "reward/mean": step / 10, "staleness/max": 1.0, "pass_at_1": 0.5},
        reward_histogram=(1, 0, 0, 0, 0, step),
    )


@pytest.fixture
def all_sinks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Tracker, Path]]:
    monkeypatch.setenv("TRACKIO_DIR", str(tmp_path / "trackio"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tracker = Tracker.open(SINK_NAMES, tmp_path, project="gyre-test", run_name="run-1")
    yield tracker, tmp_path


def test_every_sink_holds_exactly_one_row_per_step(all_sinks: tuple[Tracker, Path]) -> None:
    tracker, folder = all_sinks
    for step in STEPS:
        tracker.log_row(row(step))
        tracker.log_samples(step, [{**SAMPLE, "step": step}])
    tracker.close()
    assert tracker.failures == {}
    assert tracker.rows_logged == dict.fromkeys(SINK_NAMES, len(STEPS))

    lines = [json.loads(line) for line in (folder / "steps.jsonl").read_text().splitlines()]
    assert lines[2]["reward_histogram"] == [1, 0, 0, 0, 0, 3]
    assert len((folder / "samples.jsonl").read_text().splitlines()) == len(STEPS)
    held = logged_steps(folder, SINK_NAMES, project="gyre-test", run_name="run-1")
    assert held == {name: list(STEPS) for name in SINK_NAMES}
    assert tensorboard_steps(folder, "reward/hist_1.0") == list(STEPS)
    assert len(list(folder.glob("mlflow-artifacts/*/artifacts/samples/step-*.json"))) == len(STEPS)


def test_a_failing_sink_is_logged_counted_and_the_others_keep_logging(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_logging()  # to this test's stderr (a CLI test before may have left a closed one)
    (tmp_path / "blocked").write_text("a file where the JSONL sink wants its folder")
    tracker = Tracker.open(["jsonl"], tmp_path / "blocked", project="p", run_name="r")
    tracker.sinks += Tracker.open(["jsonl"], tmp_path / "ok", project="p", run_name="r").sinks
    for step in STEPS:
        tracker.log_row(row(step))
    assert tracker.failures == {"jsonl": len(STEPS)}
    assert capsys.readouterr().err.count("tracker_sink_failed") == len(STEPS)
    assert len((tmp_path / "ok" / "steps.jsonl").read_text().splitlines()) == len(STEPS)


def test_an_unknown_tracker_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(
        InvalidArgument, match=r"--track: unknown tracker 'neptune'; known: jsonl, tensorboard"
    ):
        parse_sinks("tensorboard,neptune")


def test_a_tracker_whose_package_is_missing_is_refused_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The package name is the only thing changed: find_spec really looks for it and finds nothing.
    monkeypatch.setitem(OPTIONAL_PACKAGES, "wandb", "wandb_absent_for_this_test")
    with pytest.raises(
        InvalidArgument,
        match=r"the wandb tracker needs the Python package 'wandb_absent_for_this_test', which is not "
        r"installed: pip install 'gyre\[track\]' \(all of them\) or pip install wandb_absent_for_this_test",
    ):
        parse_sinks("jsonl,wandb")


def test_names_are_deduplicated_and_none_means_no_tracker() -> None:
    assert parse_sinks(" TensorBoard,jsonl,tensorboard ") == ("tensorboard", "jsonl")
    assert parse_sinks("none") == ()


def test_gyre_up_track_adds_to_jsonl_and_none_turns_tracking_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GYRE_TRACK_SINKS", raising=False)
    assert up_sinks(None) == ("jsonl",)
    assert up_sinks("tensorboard,mlflow") == ("jsonl", "tensorboard", "mlflow")
    assert up_sinks("none") == ()
    monkeypatch.setenv("GYRE_TRACK_SINKS", "wandb")
    assert up_sinks(None) == ("wandb",)
