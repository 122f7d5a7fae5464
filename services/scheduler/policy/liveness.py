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
  satellite stays in a role the mode never moves it out of.

Not built yet: a watchdog for an execution whose runner is lost with nobody to report it (past
its limit plus a grace the scheduler would cancel it); today the runner's keeper reports it.

Example (the reported mode case):
    gyre, cell-1 training, cell-2 rollout; SetMode(async) between steps
    -> misplaced_satellites("async", ...) == ("cell-1",): the driver switches it back to rollout
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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
