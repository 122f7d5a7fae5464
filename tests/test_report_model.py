"""What `gyre report` computes and how it writes the page, without services."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gyre_app import report_render
from gyre_app.report_model import (
    CellSegment,
    Report,
    StepRow,
    cell_segments,
    check_shares,
    headline,
    heldout_scores,
    window_mean,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def report(**parts: object) -> Report:
    base: dict[str, object] = {
        "run": "r",
        "steps": (),
        "heldout": {},
        "staleness": {},
        "checks": (),
        "num_grades": 0,
        "num_unassessable": 0,
        "tree_execution": "",
        "tree_lanes": (),
        "cells": (),
    }
    return Report(**{**base, **parts})  # type: ignore[arg-type]


def step(version: int, reward: float | None) -> StepRow:
    return StepRow(
        version=version, reward_mean=reward, num_rewards=2, num_unassessable=0, loss=0.0,
        staleness_mean=0.0, staleness_max=0,
    )  # fmt: skip


def test_the_headline_says_what_ran_the_reward_its_control_and_the_failures() -> None:
    r = report(
        steps=(step(1, 0.2), step(2, None), step(3, 0.4), step(4, 0.6), step(5, 0.8)),
        heldout={0: 0.5, 5: 0.75},
        num_grades=12,
        num_unassessable=1,
        num_partial=2,
    )
    assert dict(headline(r)) == {
        "What ran": "run r: 5 training steps (policy v1 -> v5), 12 graded executions",
        "Reward": "0.200 at v1 -> 0.800 at v5 (+0.600); "
        "mean of the first and last 3 steps with a reward: 0.400 -> 0.600 (+0.200)",
        "Held-out": "0.500 at v0 -> 0.750 at v5 (+0.250), tasks never trained on",
        "Failures": "1 unassessable (infrastructure, no reward), "
        "2 partial (timed out or crashed, graded for what the workspace held)",
    }


def test_the_headline_says_when_there_is_no_control_and_no_reward() -> None:
    lines = dict(headline(report(steps=(step(1, None),), num_grades=1)))
    assert lines["Reward"] == "no step trained an assessable execution: no reward to show"
    assert lines["Held-out"].startswith("none: the run has no held-out tasks")
    assert lines["Failures"] == "none: every execution finished and was graded"


def test_reward_first_and_last_are_means_of_three_steps() -> None:
    rewards = [0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.8]
    assert (window_mean(rewards, first=True), window_mean(rewards, first=False)) == (
        pytest.approx(0.2),
        pytest.approx(0.7),
    )


def test_heldout_scores_are_averaged_per_version() -> None:
    assert heldout_scores([(4, 1.0), (0, 0.3), (0, 0.5)]) == {0: pytest.approx(0.4), 4: 1.0}


def test_check_shares_average_each_check_over_the_grades_that_have_it() -> None:
    [a, b] = check_shares([[("a", 0.0, 0.7), ("b", 1.0, 0.3)], [("a", 1.0, 0.7)]])
    assert (a.mean_score, a.num_grades, b.mean_score, b.num_grades) == (0.5, 2, 1.0, 1)


def test_a_cells_role_lasts_until_its_next_change() -> None:
    changes = [
        (T0 + timedelta(seconds=10), "c1", "training"),
        (T0, "c1", "rollout"),
        (T0 + timedelta(seconds=4), "c2", "rollout"),
    ]
    assert cell_segments(changes, until=T0 + timedelta(seconds=15)) == (
        CellSegment(cell_id="c1", role="rollout", start_s=0.0, end_s=10.0),
        CellSegment(cell_id="c1", role="training", start_s=10.0, end_s=15.0),
        CellSegment(cell_id="c2", role="rollout", start_s=4.0, end_s=15.0),
    )


def test_the_cell_timeline_is_drawn_when_there_are_cells(tmp_path: Path) -> None:
    segments = cell_segments(
        [(T0, "core", "training"), (T0, "c1", "rollout")], until=T0 + timedelta(seconds=5)
    )
    page = report_render.write_report(report(cells=segments), tmp_path / "r.html").read_text()
    assert "<img alt='Cell roles' src='data:image/png;base64," in page


def test_a_part_without_data_says_why_instead_of_drawing(tmp_path: Path) -> None:
    r = report(notes={"cells": "this scheduler has no cells"})
    page = report_render.write_report(r, tmp_path / "r.html").read_text()
    assert "Not drawn: this scheduler has no cells." in page


def test_a_report_that_fails_to_render_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(r: Report) -> str:
        raise RuntimeError("drawing failed")

    monkeypatch.setattr(report_render, "_reward", broken)
    with pytest.raises(RuntimeError):
        report_render.write_report(report(steps=(step(1, 0.5),)), tmp_path / "r.html")
    assert list(tmp_path.iterdir()) == []
