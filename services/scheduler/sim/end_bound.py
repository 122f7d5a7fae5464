"""What the simulation engine reads off its state: the view a policy decides on, and a lower
bound on the run's end that lets a split sweep stop a run early (pure).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.scheduler.policy.state import ClusterView
from services.scheduler.sim.workload import Executions, Workload

if TYPE_CHECKING:
    from services.scheduler.sim.engine import Simulation


def view_of(sim: Simulation) -> ClusterView:
    """The policy's view of the simulation now (its ready and running tuples are rebuilt only
    after they change: most events, an execution ending inside a group, change neither)."""
    if sim.ready_view is None:
        sim.ready_view = tuple(sim.ready)
    if sim.running_view is None:
        sim.running_view = tuple(sorted((v, n) for v, n in sim.running_by_version.items() if n))
    done = sim.finished_groups
    return ClusterView(
        now_s=sim.now,
        version=sim.version,
        rollout_cells=sim.serving,
        training_cells=len(sim.training) - sim.leaving,
        switching_to_rollout=sim.to_rollout,
        switching_to_training=sim.to_training,
        running=sim.serving_running,
        waiting=len(sim.waiting),
        groups_admitted=sim.admitted,
        queued_groups=sim.w.total_groups - sim.admitted,
        running_groups=sim.running_view,
        ready=sim.ready_view,
        step_groups=sim.step_groups,
        step_untrained_tokens=sim.pending_tokens + (sim.round_tokens if sim.in_round else 0),
        in_overhead=sim.in_update,
        training_starved_since_s=sim.starved_since,
        rollout_cell_s_per_group=sim.finished_duration / sim.slots / done if done else None,
        training_cell_s_per_group=(
            sim.finished_tokens / sim.w.tokens_per_s_per_cell / done if done else None
        ),
    )


class EndBound:
    """A lower bound on the end of a run whose roles never change (the fixed splits).

    Training: the tokens no round has taken yet train no faster than on every training cell at
    once, and every update not started yet follows, one at a time. Rollout: the executions not
    started yet (they start in admission order: 0, 1, 2, ...) run no faster than on every slot
    at once, and the last step's update follows the last of them. Both start no earlier than
    the next event.
    """

    def __init__(self, w: Workload, x: Executions) -> None:
        self.unstarted_s = [0.0] * (w.total_executions + 1)  # rollout time of executions i..
        for i in range(w.total_executions - 1, -1, -1):
            self.unstarted_s[i] = self.unstarted_s[i + 1] + x.duration_s[i]
        self.total_tokens = sum(x.tokens)

    def at_least(self, sim: Simulation, next_s: float) -> float:
        w = sim.w
        updates = w.steps - sim.version - (1 if sim.in_update else 0)
        rest_tokens = self.total_tokens - sim.trained_tokens - (sim.round_tokens if sim.in_round else 0)
        bound = next_s + updates * w.step_overhead_s
        if sim.training:
            bound += rest_tokens / (len(sim.training) * w.tokens_per_s_per_cell)
        if sim.serving and sim.started < w.total_executions:
            rollout = next_s + self.unstarted_s[sim.started] / (sim.serving * sim.slots)
            bound = max(bound, rollout + w.step_overhead_s)
        return bound
