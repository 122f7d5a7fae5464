"""The liveness rule: every wait has an end (pure).

**Rule.** Every admitted execution ends *trained*, *set aside*, *cancelled* or *failed with a
reason*, within its deadline plus a bounded grace; and every cell ends in a role the current
mode wants, so that the loop advances. No state waits for an event that may never come.

Where each wait ends, and who enforces it (each where the state lives):

- a harness running: the runner's timeout (the task's, cut to its deadline) ends it `timed_out`,
  graded as earned;
- an unassessable grade (infrastructure): `replacements` always publishes a replacement or the
  word that none comes, which the trajectory service waits for;
- an execution cancelled alone (`gyre cancel`): `retries.decide_replacement` never replaces it,
  and its group trains without it (a group left with nothing to train is set aside);
- a task cancelled in any state: `task_control.cancel_task`; a group that ended its rollout is
  withdrawn from the trainer (`TaskCancelled`) and leaves its step;
- a trajectory over the microbatch budget: the trainer trains it in a microbatch of its own;
  past what the trainer can hold, the group is set aside with the reason;
- a step that keeps failing: the trainer sets the group aside after `max_group_attempts`;
- a group set aside: its step takes another group (the live facts drop it);
- a mode change: `misplaced_satellites` here, every decision round of the driver, so no
  satellite stays in a role the mode never moves it out of;
- an execution whose runner is lost with nobody to report its end (runner and keeper both gone):
  `overdue_executions` here, run by the scheduler's `watchdog`. Past its limit plus
  `GYRE_SCHEDULER_LOST_GRACE_S` the runner is asked to cancel it; a further grace later, with
  still no end event, the scheduler ends it itself as an infrastructure failure with the reason,
  and its group is replaced or trains without it (`replacements`).

Not watched: an execution still `admitted` (not started) whose task has no deadline; a runner
may hold it in its queue for as long as its other executions run.

Example (the reported mode case):
    gyre, cell-1 training, cell-2 rollout; SetMode(async) between steps
    -> misplaced_satellites("async", ...) == ("cell-1",): the driver switches it back to rollout
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

FIXED_SPLIT_MODES = ("async",)
"""Live modes whose policy never switches a cell (`fixed_split.decide`): live, every satellite
serves and the core trains, so a satellite left in training by an earlier mode would stay there
for good (and with none serving, nothing would ever be admitted again)."""

ELASTIC_MODES = ("colocate", "gyre", "burst")
"""Live modes whose policy moves satellites both ways itself (`colocate.decide` sends a training
pool back when no step needs it; `elastic.decide` keeps at least one group's worth rolling out
while anything is admissible): either role is one they want, and they fix the balance."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SatelliteRole:
    cell_id: str
    role: str
    """rollout | training | switching | lost."""


def wanted_roles(mode: str) -> tuple[str, ...]:
    """The roles a satellite may hold in `mode` without an outside switch; KeyError if unknown.

    Example:
        async -> ("rollout",);  gyre -> ("rollout", "training")
    """
    if mode in FIXED_SPLIT_MODES:
        return ("rollout",)
    if mode in ELASTIC_MODES:
        return ("rollout", "training")
    raise KeyError(mode)


def misplaced_satellites(mode: str, satellites: Sequence[SatelliteRole]) -> tuple[str, ...]:
    """Satellites in a settled role the mode does not want: each goes back to rollout.

    A satellite mid-switch is left to end its switch (the next round sees where it ended); a
    lost one must register again first.

    Example:
        async, [cell-1 training, cell-2 rollout, cell-3 switching] -> ("cell-1",)
    """
    wanted = wanted_roles(mode)
    return tuple(s.cell_id for s in satellites if s.role in ("rollout", "training") and s.role not in wanted)


@dataclass(frozen=True, slots=True, kw_only=True)
class WatchedExecution:
    """An execution the scheduler believes admitted or running, as the watchdog sees it."""

    execution_id: str
    state: str
    """admitted | running."""
    since_s: float
    """When the scheduler first saw it in this state (clock seconds): no earlier than the truth,
    so a limit counted from here is never shorter than the runner's."""
    timeout_s: float
    """The task's timeout: the runner's limit (its timeout cut to the deadline at admission) is
    never longer, counted from the start."""
    deadline_s: float | None
    """The task's deadline (clock seconds), if any."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Overdue:
    execution_id: str
    action: Literal["cancel", "end"]
    """cancel: ask the runner to stop it; end: the scheduler ends it itself."""
    past_limit_s: float

    @property
    def reason(self) -> str:
        return f"no end from the runner {self.past_limit_s:.0f} s past its limit"


def limit_at_s(w: WatchedExecution) -> float | None:
    """When the runner must have ended it, or None when nothing bounds it here.

    Running: its start plus its timeout (the runner ends it `timed_out` by then). Admitted, not
    started: the task's deadline, past which it can no longer run in time; without one, None (a
    runner's queue may hold it as long as the executions before it run).

    Example:
        running since 100, timeout 60          -> 160
        admitted, deadline 500                 -> 500
        admitted, no deadline                  -> None
    """
    if w.state == "running":
        return w.since_s + w.timeout_s
    return w.deadline_s


def overdue_executions(
    watched: Sequence[WatchedExecution], *, now_s: float, grace_s: float
) -> tuple[Overdue, ...]:
    """Executions with no end past their limit plus `grace_s` (ask the runner to cancel), and past
    it plus twice `grace_s` (the scheduler ends them itself as an infrastructure failure).

    Example (grace 10):
        running since 0, timeout 60, now 65 -> ()
        now 75                              -> (cancel, 15 s past its limit)
        now 85                              -> (end, 25 s past its limit)
    """
    out = []
    for w in watched:
        limit = limit_at_s(w)
        if limit is None:
            continue
        past = now_s - limit
        if past >= 2 * grace_s:
            out.append(Overdue(execution_id=w.execution_id, action="end", past_limit_s=past))
        elif past >= grace_s:
            out.append(Overdue(execution_id=w.execution_id, action="cancel", past_limit_s=past))
    return tuple(out)


def blind_time_s(*, last_look_s: float, now_s: float, every_s: float) -> float:
    """How long the watchdog could not look (the database away, the scheduler stalled): time it
    does not count against an execution, whose end event may wait on the bus meanwhile.

    Example (looks every 5 s):
        last look 100, now 104  -> 0.0
        last look 100, now 160  -> 55.0
    """
    return max(0.0, now_s - last_look_s - every_s)
