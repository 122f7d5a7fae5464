"""Colocate: one pool alternates between rollout and training (pure), optionally beside A
standalone rollout cells that never train.

Every colocated cell rolls out the B groups of step k at version k, the step starts only once the
slowest of them is graded, every colocated cell switches to training, trains the step, and after
the optimizer update every one switches back. This is the baseline whose rollout tail leaves the
whole cluster waiting. No cell holds the optimizer for good: the update runs on a training cell.

With `standalone_rollout_cells=A` (the paper's ablation "Colocate + standalone rollout cells"),
A cells keep rolling out while the colocated pool trains: they may run groups of later steps,
within the staleness bound K. So that the colocated pool can always leave for training, groups
of later steps are admitted only into the standalone cells' slots (once this step's groups are
all admitted, at most A x slots executions run), and the ones the pool still hosts migrate to the
standalone cells when it leaves. Steps still take whole batches (no streaming).

Worked example (B=2, G=4, 2 cells of 4 slots, version 0, no standalone cells):
    all rolling out, nothing admitted       -> admit 2 (both groups of step 0 fit in 8 slots)
    g0 ready, g1 running                    -> nothing (training waits for the slowest)
    g0, g1 ready, nothing running           -> assign (0, 1), switch 2 cells to training
    step 0 trained and published, version 1 -> switch 2 cells back to rollout
"""

from __future__ import annotations

from services.scheduler.policy.staleness import admissible_groups, groups_for_step, groups_to_admit
from services.scheduler.policy.state import NOTHING, ClusterView, Decision, PolicyConfig


def decide(view: ClusterView, config: PolicyConfig, *, standalone_rollout_cells: int = 0) -> Decision:
    if view.in_overhead:
        return NOTHING
    standalone = standalone_rollout_cells
    # Without standalone cells nothing can be generated ahead: colocate never trains on stale data.
    staleness = config.max_staleness if standalone else 0
    assign = groups_for_step(
        step=view.version,
        places=config.groups_per_step - view.step_groups,
        ready=view.ready,
        running=view.running_groups,
        max_staleness=staleness,
        groups_per_step=config.groups_per_step,
        streaming=False,
    )
    training_phase = bool(assign) or view.step_untrained_tokens > 0
    if training_phase:
        pool = max(0, view.rollout_cells - standalone)
        return Decision(assign=assign, to_training=pool, admit=_admit(view, config, standalone, staleness))
    if view.training_cells > 0:
        return Decision(to_rollout=view.training_cells)
    if view.switching_to_rollout or view.switching_to_training:
        return NOTHING
    return Decision(admit=_admit(view, config, standalone, staleness))


def _admit(view: ClusterView, config: PolicyConfig, standalone: int, staleness: int) -> int:
    slots = config.slots_per_cell
    this_step = (view.version + 1) * config.groups_per_step - view.groups_admitted
    if not standalone:
        wanted = min(max(0, this_step), view.queued_groups)
        free = view.rollout_cells * slots - view.running
    else:
        wanted = admissible_groups(view, config, batch_sync=False)
        if this_step > 0:  # this step's own groups may fill every rollout slot
            wanted = min(wanted, this_step)
            free = view.rollout_cells * slots - view.running
        else:  # later steps' groups only what the standalone cells can hold
            free = min(view.rollout_cells, standalone) * slots - view.running
    return groups_to_admit(
        admissible=wanted, free_slots=free, waiting=view.waiting, group_size=config.group_size
    )
