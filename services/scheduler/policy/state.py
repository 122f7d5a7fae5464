"""What a scheduling policy sees and what it decides (pure).

The simulator and the live scheduler both build a `ClusterView` after every event and apply the
`Decision` a policy returns. The view holds counts, not per-cell lists, so one decision costs the
same on 16 cells as on 1,024; which concrete cells switch is chosen by `migration.plan_drain`
(rollout -> training) and by the shell (training -> rollout: any satellite not mid-microbatch).

Vocabulary (DESIGN section 3):
- a *group* is G executions of one task, admitted together at one policy version;
- *version* = optimizer steps completed; the running step has index `version`;
- *staleness* of a group consumed by step k = k - (version at its admission).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyConfig:
    """The fixed facts of a run that every policy needs."""

    num_cells: int
    slots_per_cell: int  # concurrent executions per rollout cell
    groups_per_step: int  # B
    group_size: int  # G
    max_staleness: int  # K
    total_groups: int  # steps * B: the run's whole task queue
    step_overhead_s: float
    rollout_to_training_s: float
    training_to_rollout_s: float
    tokens_per_s_per_cell: float | None = None  # training throughput of one cell, if known

    @property
    def round_trip_s(self) -> float:
        """What a satellite pays to leave training and come back (or the reverse)."""
        return self.rollout_to_training_s + self.training_to_rollout_s


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyGroup:
    """A group whose every execution has finished and been graded, not yet in a step."""

    group_id: int
    version: int  # policy version at admission: the oldest version among its tokens
    tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterView:
    """Counts describing the cluster at `now_s`; built by the shell after every event."""

    now_s: float
    version: int
    rollout_cells: int  # in the rollout role and serving
    training_cells: int  # in the training role (the core cell included), not on their way out
    switching_to_rollout: int
    switching_to_training: int
    running: int  # executions holding a slot
    # Executions of admitted groups still waiting for a slot (they start in order as slots free).
    waiting: int = 0
    groups_admitted: int
    queued_groups: int  # groups of the run not admitted yet
    # (admission version, groups) of admitted groups that are not ready yet, oldest first.
    running_groups: tuple[tuple[int, int], ...]
    ready: tuple[ReadyGroup, ...]  # ready and not yet assigned to a step, in readiness order
    step_groups: int  # groups assigned to the running step
    # Tokens of those groups whose training has not finished: a microbatch round's tokens count
    # until the round ends (not only until it starts), so during a step's last round a policy
    # still sees training work and keeps the cells that do it.
    step_untrained_tokens: int
    in_overhead: bool  # the optimizer update and weight publication of the step is running
    training_starved_since_s: float | None  # when training last ran out of work; None if it has some
    # Observed from finished groups (None before the first): cell-seconds one group costs.
    rollout_cell_s_per_group: float | None
    training_cell_s_per_group: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """What to do now; every field defaults to doing nothing."""

    assign: tuple[int, ...] = ()  # ready group ids that join the running step
    admit: int = 0  # groups to start from the queue at the current version
    to_training: int = 0  # rollout cells to drain (their requests migrate) and switch to training
    to_rollout: int = 0  # training satellites to switch to rollout at their next microbatch boundary

    @property
    def is_noop(self) -> bool:
        return not (self.assign or self.admit or self.to_training or self.to_rollout)


NOTHING = Decision()
