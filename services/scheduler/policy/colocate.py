"""Colocate: one pool alternates between rollout and training (pure).

Every cell rolls out the B groups of step k at version k (staleness 0), the step starts only once
the slowest of them is graded, every cell switches to training, trains the step, and after the
optimizer update every cell switches back. This is the baseline whose rollout tail leaves the
whole cluster waiting.

Worked example (B=2, G=4, 2 cells of 4 slots, version 0):
    all rolling out, nothing admitted       -> admit 2 (both groups of step 0 fit in 8 slots)
    g0 ready, g1 running                    -> nothing (training waits for the slowest)
    g0, g1 ready, nothing running           -> assign (0, 1), switch 2 cells to training
    step 0 trained and published, version 1 -> switch 2 cells back to rollout
"""

from __future__ import annotations

from services.scheduler.policy.staleness import groups_for_step, groups_to_admit
from services.scheduler.policy.state import NOTHING, ClusterView, Decision, PolicyConfig


def decide(view: ClusterView, config: PolicyConfig) -> Decision:
    if view.in_overhead:
        return NOTHING
    assign = groups_for_step(
        step=view.version,
        places=config.groups_per_step - view.step_groups,
        ready=view.ready,
        running=view.running_groups,
        max_staleness=0,
        groups_per_step=config.groups_per_step,
        streaming=False,
    )
    if assign or view.step_untrained_tokens > 0:
        return Decision(assign=assign, to_training=view.rollout_cells)
    if view.training_cells > 0:
        return Decision(to_rollout=view.training_cells)
    if view.switching_to_rollout or view.switching_to_training:
        return NOTHING
    # Only this step's groups, at this version: colocate never trains on stale data.
    wanted = min((view.version + 1) * config.groups_per_step - view.groups_admitted, view.queued_groups)
    admit = groups_to_admit(
        admissible=wanted,
        free_slots=view.rollout_cells * config.slots_per_cell - view.running,
        waiting=view.waiting,
        group_size=config.group_size,
    )
    return Decision(admit=admit)
