"""What `gyre report` shows, computed from what the services answered (pure).

A run is the trainer's steps; `--run NAME` keeps the steps that trained a task labelled
`run=NAME`. Tasks labelled `split=heldout` are scored, not counted in the training reward: each
carries `heldout_at=<policy version>`, the version it was scored with.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from statistics import fmean

HELDOUT = "heldout"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRow:
    """One trained step: the mean reward of its training tasks' assessable executions."""

    version: int
    reward_mean: float | None
    """None when the step trained no assessable execution of the run's training tasks."""
    num_rewards: int
    num_unassessable: int
    loss: float
    staleness_mean: float
    staleness_max: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckShare:
    """One check of the graders, over every assessable grade of the run that has it."""

    name: str
    weight: float
    """Its mean weight (a family's checks keep their weights)."""
    mean_score: float
    num_grades: int


@dataclass(frozen=True, slots=True, kw_only=True)
class CellSegment:
    """A cell held `role` from `start` to `end` (seconds since the first cell event)."""

    cell_id: str
    role: str
    start_s: float
    end_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeLane:
    """One trajectory of the execution drawn: its calls' sequence numbers and output tokens."""

    trajectory_id: str
    role: str
    seqs: tuple[int, ...]
    output_tokens: tuple[int, ...]
    selected: bool
    shared_prefix_with: str
    num_shared_prefix_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """Everything the report draws; an empty part says why in `notes`."""

    run: str
    steps: tuple[StepRow, ...]
    heldout: Mapping[int, float]
    """Policy version -> mean held-out score at it."""
    staleness: Mapping[int, int]
    """Staleness in versions -> trained samples."""
    checks: tuple[CheckShare, ...]
    num_grades: int
    num_unassessable: int
    tree_execution: str
    tree_lanes: tuple[TreeLane, ...]
    cells: tuple[CellSegment, ...]
    notes: Mapping[str, str] = field(default_factory=dict)
    """Part -> why it is empty (no held-out tasks, no cells in this scheduler, ...)."""
    num_partial: int = 0
    """Assessable grades of executions that did not finish (timed out, or crashed with their
    workspace): partial credit for what the workspace held."""
    num_replacements: int = 0
    """Executions run in place of infrastructure failures (kept out of baseline and loss)."""

    def summary(self) -> dict[str, object]:
        rewards = [s.reward_mean for s in self.steps if s.reward_mean is not None]
        versions = sorted(self.heldout)
        return {
            "run": self.run,
            "steps": len(self.steps),
            "reward_first": window_mean(rewards, first=True),
            "reward_last": window_mean(rewards, first=False),
            "heldout_first": self.heldout[versions[0]] if versions else None,
            "heldout_last": self.heldout[versions[-1]] if versions else None,
            "num_grades": self.num_grades,
            "num_unassessable": self.num_unassessable,
            "num_partial": self.num_partial,
            "num_replacements": self.num_replacements,
            "checks": {
                c.name: {"weight": round(c.weight, 6), "mean_score": round(c.mean_score, 6)}
                for c in self.checks
            },
            "staleness": {str(k): v for k, v in self.staleness.items()},
        }


def headline(report: Report) -> tuple[tuple[str, str], ...]:
    """The page's opening lines, (label, sentence), for a person rather than a program.

    Example: run r1, rewards 0.25, 0.75 over 2 steps, held-out 0.5 at v0 and 0.75 at v2 ->
        ("What ran", "run r1: 2 training steps (policy v1 -> v2), 8 graded executions"),
        ("Reward", "0.250 at v1 -> 0.750 at v2 (+0.500); mean of the first and last 3 steps with
                    a reward: 0.500 -> 0.500 (+0.000)"),
        ("Held-out", "0.500 at v0 -> 0.750 at v2 (+0.250), tasks never trained on"),
        ("Failures", "none: ..."),
    """
    s = report.summary()
    versions = [row.version for row in report.steps]
    span = f"policy v{versions[0]} -> v{versions[-1]}" if versions else "no policy version"
    ran = (
        f"{'run ' + report.run if report.run else 'every trained step'}: "
        f"{_count(len(report.steps), 'training step')} ({span}), "
        f"{_count(report.num_grades, 'graded execution')}"
    )
    rewarded = [(row.version, row.reward_mean) for row in report.steps if row.reward_mean is not None]
    first, last = s["reward_first"], s["reward_last"]
    if rewarded and isinstance(first, float) and isinstance(last, float):
        (v0, r0), (v1, r1) = rewarded[0], rewarded[-1]
        reward = (
            f"{r0:.3f} at v{v0} -> {r1:.3f} at v{v1} ({r1 - r0:+.3f}); "
            f"mean of the first and last 3 steps with a reward: "
            f"{first:.3f} -> {last:.3f} ({last - first:+.3f})"
        )
    else:
        reward = "no step trained an assessable execution: no reward to show"
    held = sorted(report.heldout)
    if not held:
        heldout = "none: the run has no held-out tasks (and no learning-rate-0 control arm is run here)"
    elif len(held) == 1:
        heldout = f"{report.heldout[held[0]]:.3f} at v{held[0]}, scored once: no later score to compare"
    else:
        a, b = report.heldout[held[0]], report.heldout[held[-1]]
        heldout = f"{a:.3f} at v{held[0]} -> {b:.3f} at v{held[-1]} ({b - a:+.3f}), tasks never trained on"
    failed = [
        (report.num_unassessable, "unassessable (infrastructure, no reward)"),
        (report.num_partial, "partial (timed out or crashed, graded for what the workspace held)"),
        (report.num_replacements, "replaced infrastructure failures"),
    ]
    failures = (
        ", ".join(f"{n} {what}" for n, what in failed if n) or "none: every execution finished and was graded"
    )
    return (("What ran", ran), ("Reward", reward), ("Held-out", heldout), ("Failures", failures))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def window_mean(values: Sequence[float], *, first: bool, size: int = 3) -> float | None:
    """Mean of the first (or last) `size` values; None for none. Example: (1, 2, 3, 4), last -> 3.0."""
    part = values[:size] if first else values[-size:]
    return round(fmean(part), 6) if part else None


def mean_or_none(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def heldout_scores(points: Iterable[tuple[int, float]]) -> dict[int, float]:
    """(version, score) pairs -> mean score per version, oldest first.

    Example: [(0, 0.3), (0, 0.5), (4, 1.0)] -> {0: 0.4, 4: 1.0}
    """
    by_version: dict[int, list[float]] = defaultdict(list)
    for version, score in points:
        by_version[version].append(score)
    return {v: fmean(s) for v, s in sorted(by_version.items())}


def check_shares(grades: Iterable[Sequence[tuple[str, float, float]]]) -> tuple[CheckShare, ...]:
    """Each grade's (check, score, weight) triples -> one share per check name, by name.

    Example: [[("f2p", 0, 0.7), ("p2p", 1, 0.3)], [("f2p", 1, 0.7), ("p2p", 1, 0.3)]]
        -> f2p mean 0.5 weight 0.7 (2 grades), p2p mean 1.0 weight 0.3 (2 grades)
    """
    scores: dict[str, list[float]] = defaultdict(list)
    weights: dict[str, list[float]] = defaultdict(list)
    for grade in grades:
        for name, score, weight in grade:
            scores[name].append(score)
            weights[name].append(weight)
    return tuple(
        CheckShare(name=n, weight=fmean(weights[n]), mean_score=fmean(scores[n]), num_grades=len(scores[n]))
        for n in sorted(scores)
    )


def cell_segments(
    changes: Iterable[tuple[datetime, str, str]], *, until: datetime
) -> tuple[CellSegment, ...]:
    """(time, cell, role) changes, any order -> each cell's roles as segments ending at the next
    change of that cell (the last one at `until`); times in seconds since the first change.

    Example: (t0, c1, rollout), (t0+10, c1, training), until t0+15
        -> c1 rollout 0-10, c1 training 10-15
    """
    ordered = sorted(changes)
    if not ordered:
        return ()
    t0 = ordered[0][0]
    current: dict[str, tuple[str, float]] = {}
    out: list[CellSegment] = []
    for at, cell, role in ordered:
        now = (at - t0).total_seconds()
        if cell in current:
            old_role, since = current[cell]
            out.append(CellSegment(cell_id=cell, role=old_role, start_s=since, end_s=now))
        current[cell] = (role, now)
    end = max(0.0, (until - t0).total_seconds())
    for cell, (role, since) in current.items():
        out.append(CellSegment(cell_id=cell, role=role, start_s=since, end_s=max(since, end)))
    return tuple(sorted(out, key=lambda s: (s.cell_id, s.start_s)))
