"""One policy, two drivers: the simulator's facts, fed to the live scheduler's fold and decision
function, give the simulator's view and its decision at every step of a whole run, in every mode.

The simulation below is the real one (`sim.engine.Simulation`); it only reports each fact as it
happens (a group admitted, an execution started or ended, a group ready, groups assigned,
training rounds, the update, role changes) to a `LiveFacts`, as the live scheduler's consumers
do from events. At each decision the live path (`LiveFacts.view` + `live_policy.policy_for`)
must return exactly what the simulator's path (`Simulation.view` + its mode's policy) returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from services.scheduler.cells import Mode
from services.scheduler.live_policy import policy_for
from services.scheduler.live_view import LiveFacts
from services.scheduler.policy.state import Decision
from services.scheduler.sim.engine import Simulation
from services.scheduler.sim.modes import policy_config, setup
from services.scheduler.sim.workload import Executions, Workload, draw_executions, parse_workload

WORKLOAD: dict[str, Any] = {
    "name": "live-vs-sim",
    "seed": 11,
    "cells": 5,
    "steps": 6,
    "groups_per_step": 2,
    "group_size": 3,
    "max_staleness": 1,
    "async_rollout_cells": 2,
    "execution": {
        "duration_s": {"dist": "lognormal", "median": 200, "sigma": 0.9},
        "timeout_s": 900,
        "tokens": {"dist": "lognormal", "median": 30000, "sigma": 0.5},
    },
    "rollout": {"executions_per_cell": 3, "migrate_s": 2.0},
    "training": {"tokens_per_s_per_cell": 1000, "step_overhead_s": 15, "microbatch_tokens": 8192},
    "switch": {"rollout_to_training_s": 8.52, "training_to_rollout_s": 3.46},
}


class Reporting(Simulation):
    """The simulator, reporting its facts to a LiveFacts and checking the live decision each time."""

    def __init__(self, w: Workload, x: Executions, mode: Mode) -> None:
        s = setup(mode, w)
        super().__init__(w, x, s.policy, initial_training=s.initial_training, core_cell=s.core_cell)
        self.facts = LiveFacts(
            total_groups=w.total_groups,
            group_size=w.group_size,
            slots_per_cell=w.executions_per_cell,
            tokens_per_s_per_cell=w.tokens_per_s_per_cell,
        )
        for cell in range(w.cells):
            self.facts.cell_role(str(cell), "training" if cell < s.initial_training else "rollout")
        self.live = policy_for(mode, policy_config(w))
        self.decisions: list[Decision] = []

    def _decide(self) -> None:
        for _ in range(4):
            view = self.view()
            assert self.facts.view(self.now) == view
            decision = self.policy(view)
            assert self.live(self.facts.view(self.now)) == decision
            self.decisions.append(decision)
            if decision.is_noop:
                return
            self._apply(decision)

    def _admit(self) -> None:
        self.facts.group_admitted(self.admitted)
        super()._admit()

    def _start_waiting(self) -> None:
        before = len(self.waiting)
        super()._start_waiting()
        for _ in range(before - len(self.waiting)):
            self.facts.execution_started()

    def _exec_end(self, e: int, generation: int) -> None:
        if self.exec_generation[e] != generation:  # superseded: the execution moved
            super()._exec_end(e, generation)
            return
        group = e // self.w.group_size
        self.facts.execution_ended(group)
        if self.group_left[group] == 1:  # this end makes the group ready
            g = self.w.group_size
            members = range(group * g, group * g + g)
            self.facts.group_ready(
                group,
                tokens=sum(self.x.tokens[i] for i in members),
                duration_s=sum(self.x.duration_s[i] for i in members),
            )
        super()._exec_end(e, generation)

    def _assign(self, group_ids: tuple[int, ...]) -> None:
        self.facts.groups_assigned(group_ids)
        super()._assign(group_ids)

    def _maybe_start_round(self) -> None:
        in_round, in_update = self.in_round, self.in_update
        super()._maybe_start_round()
        if self.in_round and not in_round:
            self.facts.training_started()
        if self.in_update and not in_update:
            self.facts.update_started()

    def _round_end(self) -> None:
        tokens = self.round_tokens
        super()._round_end()
        self.facts.tokens_trained(tokens)
        if not self.in_round and not self.in_update:
            self.facts.training_stopped(now_s=self.now)

    def _update_end(self) -> None:
        super()._update_end()
        self.facts.step_completed(now_s=self.now)

    def _switch(self, cell: int, role: str, duration_s: float) -> None:
        super()._switch(cell, role, duration_s)
        self.facts.cell_role(str(cell), f"to_{role}")

    def _switch_end(self, cell: int) -> None:
        super()._switch_end(cell)
        self.facts.cell_role(str(cell), self.cells[cell].role)

    def _release(self, count: int) -> None:
        super()._release(count)
        for cell, c in enumerate(self.cells):
            if c.leaving:
                self.facts.cell_role(str(cell), "leaving")


@pytest.mark.parametrize("mode", ["gyre", "burst", "colocate", "async"])
def test_the_live_path_decides_what_the_simulator_decides_at_every_step(mode: Mode) -> None:
    w = parse_workload(WORKLOAD, base_dir=Path("."))
    sim = Reporting(w, draw_executions(w), mode)
    result = sim.run()
    assert result.steps == w.steps
    acted = [d for d in sim.decisions if not d.is_noop]
    assert len(acted) >= w.steps  # the run made real decisions, each checked on both paths
    if mode == "gyre":  # cells moved both ways, each move decided identically on both paths
        assert any(d.to_training for d in acted) and any(d.to_rollout for d in acted)
