"""Facts about the cluster folded into the `ClusterView` every policy reads (pure).

The live scheduler and the simulator feed the same facts here: cells changing role, groups
admitted, executions starting and ending, groups ready, groups assigned to the running step,
tokens trained, the update starting and the step completing. `view(now_s)` then builds the view
the policy functions take, so both drivers make the same decision from the same facts (the test
`tests/test_live_policy.py` runs the simulator through this fold and compares every decision).

What the live system cannot observe directly it reports as the nearest fact: the trainer does
not announce its rounds, so a step's groups count as untrained until its `StepCompleted`; a
group's tokens are unknown until it is trained, so the live shell passes the mean tokens of the
groups trained so far.

Example:
    facts = LiveFacts(total_groups=4, group_size=2, slots_per_cell=4, tokens_per_s_per_cell=1000.0)
    facts.cell_role("cell-1", "rollout"); facts.cell_role("cell-0", "training")
    facts.group_admitted(0)                  # version 0: 2 executions wait for a slot
    facts.execution_started(); facts.execution_started()
    facts.view(now_s=1.0).running            -> 2
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from services.scheduler.policy.state import ClusterView, ReadyGroup

ROLES = ("rollout", "training", "to_rollout", "to_training", "leaving")


@dataclass(slots=True)
class LiveFacts:
    total_groups: int
    group_size: int
    slots_per_cell: int
    tokens_per_s_per_cell: float  # training throughput of one cell (live: as last measured)
    version: int = 0
    roles: dict[str, str] = field(default_factory=dict)
    admitted: int = 0
    group_version: dict[int, int] = field(default_factory=dict)
    group_left: dict[int, int] = field(default_factory=dict)
    not_ready: dict[int, int] = field(default_factory=dict)  # group -> admission version
    waiting: int = 0
    running: int = 0
    ready: list[ReadyGroup] = field(default_factory=list)
    step_groups: int = 0
    untrained_tokens: int = 0
    in_update: bool = False
    starved_since_s: float | None = 0.0
    finished_groups: int = 0
    finished_duration_s: float = 0.0  # sum of the finished groups' execution durations
    finished_tokens: int = 0

    # -- cells ----------------------------------------------------------------------------------

    def cell_role(self, cell_id: str, role: str) -> None:
        """`rollout`, `training` (serving / training now), `to_rollout`, `to_training` (switching),
        `leaving` (a training satellite told to leave at its microbatch boundary), or `gone`."""
        assert role in (*ROLES, "gone"), role
        if role == "gone":
            self.roles.pop(cell_id, None)
        else:
            self.roles[cell_id] = role

    def _count(self, *roles: str) -> int:
        return sum(1 for r in self.roles.values() if r in roles)

    # -- rollout --------------------------------------------------------------------------------

    def group_admitted(self, group_id: int, *, size: int | None = None) -> None:
        """Admitted at the current version; `size` when groups differ (live), else `group_size`."""
        n = self.group_size if size is None else size
        self.admitted += 1
        self.group_version[group_id] = self.version
        self.group_left[group_id] = n
        self.not_ready[group_id] = self.version
        self.waiting += n

    def execution_started(self) -> None:
        self.waiting -= 1
        self.running += 1

    def execution_ended(self, group_id: int) -> None:
        self.running -= 1
        self.group_left[group_id] -= 1

    def group_ready(self, group_id: int, *, tokens: int, duration_s: float) -> None:
        """Every execution ended (and was graded): the group may join a step. `duration_s` is the
        sum of its executions' durations (its rollout cost is that over the slots of a cell)."""
        assert self.group_left.get(group_id) == 0, f"group {group_id} still has running executions"
        del self.not_ready[group_id], self.group_left[group_id]
        version = self.group_version.pop(group_id)
        self.ready.append(ReadyGroup(group_id=group_id, version=version, tokens=tokens))
        self.finished_groups += 1
        self.finished_duration_s += duration_s
        self.finished_tokens += tokens

    def groups_gone(self, count: int, *, duration_s: float, tokens_per_group: int) -> None:
        """`count` groups admitted, ready and gone from the pool (trained or set aside) before
        the facts at hand: what `group_admitted`, their executions and `group_ready` leave of
        them once they leave the pool, in one step."""
        self.admitted += count
        self.finished_groups += count
        self.finished_duration_s += duration_s
        self.finished_tokens += count * tokens_per_group

    # -- training -------------------------------------------------------------------------------

    def groups_assigned(self, group_ids: Iterable[int]) -> None:
        wanted = set(group_ids)
        taken = [g for g in self.ready if g.group_id in wanted]
        assert len(taken) == len(wanted), "assigned a group that is not ready"
        self.ready = [g for g in self.ready if g.group_id not in wanted]
        self.step_groups += len(taken)
        self.untrained_tokens += sum(g.tokens for g in taken)

    def training_started(self) -> None:
        """Training has work in hand (a round, or the step) and is computing it."""
        self.starved_since_s = None

    def tokens_trained(self, tokens: int) -> None:
        """Training finished `tokens` of the step's tokens (a round ended). They count as
        untrained until then, so a policy keeps the cells that are training them."""
        self.untrained_tokens -= tokens

    def training_stopped(self, *, now_s: float) -> None:
        """Training ran out of work (and no update runs)."""
        if not self.in_update:
            self.starved_since_s = now_s

    def update_started(self) -> None:
        self.in_update = True
        self.starved_since_s = None

    def step_completed(self, *, now_s: float) -> None:
        self.in_update = False
        self.version += 1
        self.step_groups = 0
        self.starved_since_s = now_s

    # -- the view -------------------------------------------------------------------------------

    def running_groups(self) -> tuple[tuple[int, int], ...]:
        """(admission version, groups) of admitted groups not ready yet, oldest first."""
        by_version: dict[int, int] = {}
        for version in self.not_ready.values():
            by_version[version] = by_version.get(version, 0) + 1
        return tuple(sorted(by_version.items()))

    def view(self, now_s: float) -> ClusterView:
        n = self.finished_groups
        return ClusterView(
            now_s=now_s,
            version=self.version,
            rollout_cells=self._count("rollout"),
            training_cells=self._count("training"),
            switching_to_rollout=self._count("to_rollout", "leaving"),
            switching_to_training=self._count("to_training"),
            running=self.running,
            waiting=self.waiting,
            groups_admitted=self.admitted,
            queued_groups=self.total_groups - self.admitted,
            running_groups=self.running_groups(),
            ready=tuple(self.ready),
            step_groups=self.step_groups,
            step_untrained_tokens=self.untrained_tokens,
            in_overhead=self.in_update,
            training_starved_since_s=self.starved_since_s,
            rollout_cell_s_per_group=self.finished_duration_s / self.slots_per_cell / n if n else None,
            training_cell_s_per_group=self.finished_tokens / self.tokens_per_s_per_cell / n if n else None,
        )
