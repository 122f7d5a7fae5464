"""What one simulated run produced: cell timelines, busy times and per-execution traces (pure).

Cell-time accounting (shares of cells x wall time): rollout_busy = sum of execution durations /
slots (a half-full rollout cell is half idle); training_busy = tokens / rate plus one cell per
update; switching = switch and transfer time plus the slot-time of paused executions; sync =
group set-up and all-reduce time of every round member; idle = the rest.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

ROLLOUT, TRAINING, SWITCHING = "rollout", "training", "switching"


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    start_s: float
    end_s: float
    role: str


@dataclass(slots=True, kw_only=True)
class Result:
    wall_s: float
    num_cells: int
    rollout_busy_s: float
    training_busy_s: float
    switching_s: float
    sync_s: float  # cell-seconds of data-parallel group set-up and gradient all-reduce
    num_switches: int
    migrations: int
    steps: int
    executions: int
    timeouts: int
    staleness: list[int]  # one per consumed group
    step_end_s: list[float]
    timeline: list[list[Segment]]  # per cell, contiguous, in time order
    # Only with trace=True: per execution (cell, start, end) hosting intervals; training rounds.
    hosting: list[list[tuple[int, float, float]]] = field(default_factory=list)
    rounds: list[tuple[float, float, tuple[int, ...]]] = field(default_factory=list)
    trained_tokens: int = 0
    paused_s: list[float] = field(default_factory=list)  # per execution: time its migrations paused it
    # a(v): groups admitted at versions <= v, per version (the run's admission sequence).
    admitted_by_version: list[int] = field(default_factory=list)

    def shares(self) -> dict[str, float]:
        total = self.num_cells * self.wall_s
        busy = {
            "rollout_busy": self.rollout_busy_s / total,
            "training_busy": self.training_busy_s / total,
            "switching": self.switching_s / total,
            "sync": self.sync_s / total,
        }
        return {**busy, "idle": 1.0 - sum(busy.values())}


def admitted_by_version(group_versions: list[int], steps: int) -> list[int]:
    """How many groups were admitted by each version (cumulative), for the run's own bound,
    from the version each admitted group was admitted at.

    Example: admitted_by_version([0, 0, 1], 3) -> [2, 3, 3]
    """
    per_version = [0] * steps
    for version in group_versions:
        per_version[version] += 1
    return list(itertools.accumulate(per_version))
