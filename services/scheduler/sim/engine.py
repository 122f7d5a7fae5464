"""Discrete-event simulation of a cluster on a virtual clock, driven by a policy function (pure:
no wall clock, no randomness; the executions are drawn beforehand from the workload's seed).

What it models (rollout, migration, joining and leaving training, microbatch rounds, steps, weight
publication, staleness) is stated once, in the package docstring (`services.scheduler.sim`).
Cell-time accounting: `result.Result.shares`.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from services.scheduler.policy.migration import plan_drain
from services.scheduler.policy.state import ClusterView, Decision, ReadyGroup
from services.scheduler.sim.end_bound import EndBound, view_of
from services.scheduler.sim.result import ROLLOUT, SWITCHING, TRAINING, Result, Segment, admitted_by_version
from services.scheduler.sim.workload import Executions, Workload

Policy = Callable[[ClusterView], Decision]

_EXEC_END, _SWITCH_END, _ROUND_END, _UPDATE_END, _STEP_START = 0, 1, 2, 3, 4


@dataclass(slots=True)
class _Cell:
    role: str
    target: str = ""  # the role a switching cell will have
    running: set[int] = field(default_factory=set)
    leaving: bool = False
    since_s: float = 0.0


class Simulation:
    """One run of one policy over one workload's executions."""

    def __init__(
        self,
        workload: Workload,
        executions: Executions,
        policy: Policy,
        *,
        initial_training: int,
        core_cell: bool,
        trace: bool = False,
        fixed_roles: bool = False,
    ) -> None:
        self.w, self.x, self.policy, self.trace = workload, executions, policy, trace
        # A policy that never switches a cell (the fixed splits): `run_within` may then stop a
        # run by a lower bound on its end, not only once its clock passes the limit.
        self.fixed_roles = fixed_roles
        self.core_cell = core_cell  # cell 0 holds the optimizer and never leaves training
        self.slots = workload.executions_per_cell
        self.now = 0.0
        self.heap: list[tuple[float, int, int, int, int]] = []
        self.seq = 0
        n = workload.cells
        self.cells = [_Cell(TRAINING if i < initial_training else ROLLOUT) for i in range(n)]
        self.timeline: list[list[Segment]] = [[] for _ in range(n)]
        # Serving rollout cells by load, for best-fit placement.
        self.by_load: list[set[int]] = [set() for _ in range(self.slots + 1)]
        for i in range(initial_training, n):
            self.by_load[0].add(i)
        self.serving = n - initial_training
        self.serving_running = 0
        self.training = set(range(initial_training))
        self.leaving = 0  # training cells told to leave at their next microbatch boundary
        self.to_rollout = self.to_training = 0
        # Executions and groups.
        g_count = workload.total_groups
        self.exec_end = [0.0] * workload.total_executions
        self.exec_generation = [0] * workload.total_executions
        self.exec_start = [0.0] * workload.total_executions
        self.paused = [0.0] * workload.total_executions  # migration pauses, per execution
        self.exec_cell = [-1] * workload.total_executions
        self.group_left = [workload.group_size] * g_count
        self.group_version = [0] * g_count
        self.admitted = 0
        self.waiting: deque[int] = deque()  # executions of admitted groups waiting for a slot
        self.started = 0  # executions start in admission order: 0 .. started-1 have
        self.running_by_version: dict[int, int] = {}
        self.ready: list[ReadyGroup] = []
        # The view's copies of `ready` and `running_by_version`, rebuilt only after they change:
        # most events (an execution ending inside a group) change neither.
        self.ready_view: tuple[ReadyGroup, ...] | None = ()
        self.running_view: tuple[tuple[int, int], ...] | None = ()
        self.finished_duration = 0.0
        self.finished_tokens = 0
        self.finished_groups = 0
        # Step.
        self.version = 0
        self.step_groups = 0
        self.pending_tokens = 0
        self.round_tokens = 0
        self.round_members: tuple[int, ...] = ()
        self.group: tuple[int, ...] = ()  # the data-parallel group's members, as last formed
        self.in_round = False
        self.in_update = False
        self.starts_at = 0.0  # the running step's first round begins no earlier (`step_start_s`)
        self.update_cell = -1  # the training cell running the step's update
        self.starved_since: float | None = 0.0
        # Accounting.
        self.rollout_busy = self.training_busy = self.switching = self.sync = 0.0
        self.num_switches = self.migrations = self.trained_tokens = 0
        self.staleness: list[int] = []
        self.step_end: list[float] = []
        self.hosting: list[list[tuple[int, float, float]]] = (
            [[] for _ in range(workload.total_executions)] if trace else []
        )
        self.rounds: list[tuple[float, float, tuple[int, ...]]] = []

    # -- event plumbing -------------------------------------------------------------------------

    def _at(self, time_s: float, kind: int, ref: int, generation: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (time_s, self.seq, kind, ref, generation))

    def run(self) -> Result:
        result = self.run_within(math.inf)
        assert result is not None
        return result

    def run_within(self, past_s: float) -> Result | None:
        """`run`, or None as soon as the run is certain to take longer than `past_s` (its next
        event lies beyond it, and the run ends at an event no earlier): a split sweep then stops
        a split that cannot be its best instead of simulating it to the end."""
        self._decide()
        # Past this the run is certain to end after `past_s` (the margin keeps a float rounding
        # in the bound from stopping a run that ties with it).
        bound_past = past_s + 1e-9 * abs(past_s) + 1e-6
        # The bound is asked every 16th event: it moves slowly, and asking costs a tenth of one.
        bound = EndBound(self.w, self.x) if self.fixed_roles and past_s < math.inf else None
        events = 0
        while self.version < self.w.steps:
            if not self.heap:
                raise RuntimeError(f"simulation stalled at t={self.now:.1f}s, version {self.version}")
            time_s = self.heap[0][0]
            events += 1
            if time_s > past_s or (bound and events % 16 == 0 and bound.at_least(self, time_s) > bound_past):
                return None
            self.now = time_s
            while self.heap and self.heap[0][0] == time_s:
                _, _, kind, ref, generation = heapq.heappop(self.heap)
                if kind == _EXEC_END:
                    self._exec_end(ref, generation)
                elif kind == _SWITCH_END:
                    self._switch_end(ref)
                elif kind == _ROUND_END:
                    self._round_end()
                elif kind == _STEP_START:
                    self._maybe_start_round()
                else:
                    self._update_end()
            if self.version < self.w.steps:
                self._decide()
        return self._result()

    # -- policy ---------------------------------------------------------------------------------

    def view(self) -> ClusterView:
        return view_of(self)

    def _decide(self) -> None:
        for _ in range(4):
            decision = self.policy(self.view())
            if decision.is_noop:
                return
            self._apply(decision)

    def _apply(self, d: Decision) -> None:
        if d.assign:
            self._assign(d.assign)
        if d.to_training:
            self._drain(d.to_training)
        if d.to_rollout:
            self._release(d.to_rollout)
        for _ in range(d.admit):
            self._admit()

    # -- rollout --------------------------------------------------------------------------------

    def _admit(self) -> None:
        assert self.admitted < self.w.total_groups, "policy admitted past the end of the queue"
        assert self.serving * self.slots - self.serving_running > len(self.waiting), "no free slot"
        group = self.admitted
        self.admitted += 1
        self.group_version[group] = self.version
        self.running_by_version[self.version] = self.running_by_version.get(self.version, 0) + 1
        self.running_view = None
        g = self.w.group_size
        self.waiting.extend(range(group * g, group * g + g))
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting executions, in admission order, in the free slots."""
        while self.waiting and self.serving * self.slots > self.serving_running:
            e = self.waiting.popleft()
            self.started += 1
            self._host(e, self._fullest_with_room())
            self.exec_start[e] = self.now
            self.exec_end[e] = self.now + self.x.duration_s[e]
            self._at(self.exec_end[e], _EXEC_END, e)

    def _fullest_with_room(self) -> int:
        for load in range(self.slots - 1, -1, -1):
            if self.by_load[load]:
                return min(self.by_load[load])
        raise AssertionError("no rollout slot free")

    def _set_load(self, cell: int, old: int, new: int) -> None:
        self.by_load[old].discard(cell)
        self.by_load[new].add(cell)

    def _host(self, e: int, cell: int) -> None:
        c = self.cells[cell]
        assert c.role == ROLLOUT and len(c.running) < self.slots
        self._set_load(cell, len(c.running), len(c.running) + 1)
        c.running.add(e)
        self.exec_cell[e] = cell
        self.serving_running += 1
        if self.trace:
            self.hosting[e].append((cell, self.now, math.inf))

    def _unhost(self, e: int) -> int:
        cell = self.exec_cell[e]
        c = self.cells[cell]
        self._set_load(cell, len(c.running), len(c.running) - 1)
        c.running.discard(e)
        self.serving_running -= 1
        if self.trace:
            host_cell, start, _ = self.hosting[e][-1]
            self.hosting[e][-1] = (host_cell, start, self.now)
        return cell

    def _exec_end(self, e: int, generation: int) -> None:
        # Each move reschedules the end with a new generation; comparing end times instead would
        # let a zero-cost move leave two live end events for one execution.
        if self.exec_generation[e] != generation:
            return  # superseded: the execution migrated and ends later
        self._unhost(e)
        self.rollout_busy += self.x.duration_s[e] / self.slots
        group = e // self.w.group_size
        self.group_left[group] -= 1
        if self.group_left[group] == 0:
            g = self.w.group_size
            members = range(group * g, group * g + g)
            tokens = sum(self.x.tokens[i] for i in members)
            self.finished_duration += sum(self.x.duration_s[i] for i in members)
            self.finished_tokens += tokens
            self.finished_groups += 1
            self.running_by_version[self.group_version[group]] -= 1
            self.ready.append(ReadyGroup(group_id=group, version=self.group_version[group], tokens=tokens))
            self.ready_view = self.running_view = None
        self._start_waiting()

    # -- role switches --------------------------------------------------------------------------

    def _drain(self, count: int) -> None:
        # migration.max_freeable from counters, so an infeasible request costs O(1).
        free_at_most = max(0, self.serving - math.ceil(self.serving_running / self.slots))
        if min(count, free_at_most) <= 0:
            return
        loads = {i: len(c.running) for i, c in enumerate(self.cells) if c.role == ROLLOUT}
        plan = plan_drain(loads=loads, slots_per_cell=self.slots, count=count)
        moving: list[tuple[int, int, int]] = []  # (execution, source, target)
        queues = {m.source: sorted(self.cells[m.source].running) for m in plan.moves}
        for move in plan.moves:
            taken, queues[move.source] = (
                queues[move.source][: move.executions],
                queues[move.source][move.executions :],
            )
            moving.extend((e, move.source, move.target) for e in taken)
        # The KV caches leaving one cell share its link: each of its moves pauses until all land.
        transfer: dict[int, float] = {}
        for e, source, _ in moving:
            transfer[source] = (
                transfer.get(source, self.w.migrate_s) + self._kv_bytes(e) / self.w.link_bytes_per_s
            )
        for e, source, target in moving:
            self._unhost(e)
            self._host(e, target)
            self.exec_end[e] += transfer[source]
            self.exec_generation[e] += 1
            self._at(self.exec_end[e], _EXEC_END, e, self.exec_generation[e])
            self.migrations += 1
            self.switching += transfer[source] / self.slots
            self.paused[e] += transfer[source]
        for cell in plan.freed:
            assert not self.cells[cell].running
            # The freed cell sends its KV, switches, then receives the weights it trains with.
            switch_s = transfer.get(cell, 0.0) + self.w.rollout_to_training_s + self.w.join_s
            self._switch(cell, TRAINING, switch_s)

    def _kv_bytes(self, e: int) -> float:
        """KV cache of a running execution: its context so far (tokens in proportion to the time
        it has run, up to `max_context_tokens`)."""
        ran = self.now - self.exec_start[e] - self.paused[e]  # a pause under way counts as done: low
        done = ran / self.x.duration_s[e]
        context = min(float(self.w.max_context_tokens), self.x.tokens[e] * min(1.0, max(0.0, done)))
        return context * self.w.kv_bytes_per_token

    def _release(self, count: int) -> None:
        core = 0 if self.core_cell else -1
        candidates = sorted(
            (c for c in self.training if c != core and not self.cells[c].leaving), reverse=True
        )
        for cell in candidates[:count]:
            busy = self.in_round and cell in self.round_members
            if busy or (self.in_update and cell == self.update_cell):
                self.cells[cell].leaving = True
                self.leaving += 1
                self.to_rollout += 1
            else:
                self._switch(cell, ROLLOUT, self.w.training_to_rollout_s)

    def _switch(self, cell: int, role: str, duration_s: float) -> None:
        assert not self.fixed_roles, "a fixed-split policy switched a cell"
        c = self.cells[cell]
        self._close(cell)
        if c.role == ROLLOUT:
            self.by_load[len(c.running)].discard(cell)
            self.serving -= 1
        elif c.role == TRAINING:
            self.training.discard(cell)
            if c.leaving:
                c.leaving = False
                self.leaving -= 1
                self.to_rollout -= 1
        c.role, c.target = SWITCHING, role
        if role == ROLLOUT:
            self.to_rollout += 1
        else:
            self.to_training += 1
        self.num_switches += 1
        self.switching += duration_s
        self._at(self.now + duration_s, _SWITCH_END, cell)

    def _switch_end(self, cell: int) -> None:
        c = self.cells[cell]
        self._close(cell)
        c.role = c.target
        if c.role == ROLLOUT:
            self.to_rollout -= 1
            self.serving += 1
            self.by_load[0].add(cell)
            self._start_waiting()
        else:
            self.to_training -= 1
            self.training.add(cell)
            self._maybe_start_round()

    def _close(self, cell: int) -> None:
        c = self.cells[cell]
        if self.now > c.since_s:
            self.timeline[cell].append(Segment(start_s=c.since_s, end_s=self.now, role=c.role))
        c.since_s = self.now

    # -- training -------------------------------------------------------------------------------

    def _assign(self, group_ids: tuple[int, ...]) -> None:
        wanted = set(group_ids)
        taken = [g for g in self.ready if g.group_id in wanted]
        assert len(taken) == len(wanted), "policy assigned a group that is not ready"
        assert self.step_groups + len(taken) <= self.w.groups_per_step and not self.in_update
        self.ready = [g for g in self.ready if g.group_id not in wanted]
        self.ready_view = None
        if self.step_groups == 0 and taken and self.w.step_start_s > 0:
            self.starts_at = self.now + self.w.step_start_s
            self._at(self.starts_at, _STEP_START, 0)
        for g in taken:
            stale = self.version - g.version
            assert stale <= self.w.max_staleness, f"group {g.group_id} staleness {stale}"
            self.staleness.append(stale)
            self.pending_tokens += g.tokens
        self.step_groups += len(taken)
        self._maybe_start_round()

    def _maybe_start_round(self) -> None:
        if self.in_round or self.in_update or self.now < self.starts_at:
            return
        if self.pending_tokens == 0:
            if self._step_complete():
                self._start_update()
            return
        staying = (
            self.training if not self.leaving else (c for c in self.training if not self.cells[c].leaving)
        )
        members = tuple(sorted(staying))
        if not members:
            return
        rate = self.w.tokens_per_s_per_cell
        tokens = min(self.pending_tokens, len(members) * self.w.microbatch_tokens)
        self.pending_tokens -= tokens
        # A new membership forms its data-parallel group first; every round all-reduces.
        setup = self.w.group_setup_s if members != self.group else 0.0
        sync = setup + self.w.allreduce_s(len(members))
        self.group = members
        self.sync += sync * len(members)
        self.round_tokens, self.round_members, self.in_round = tokens, members, True
        self.starved_since = None
        end = self.now + sync + tokens / (len(members) * rate)
        if self.trace:
            self.rounds.append((self.now, end, members))
        self._at(end, _ROUND_END, 0)

    def _round_end(self) -> None:
        self.in_round = False
        self.training_busy += self.round_tokens / self.w.tokens_per_s_per_cell
        self.trained_tokens += self.round_tokens
        # The step's update runs on a training cell: if every cell was told to leave during the
        # step's last round, one of them stays until the update is published.
        holder = self._update_holder() if self._step_complete() else None
        for cell in self.round_members:
            if self.cells[cell].leaving and cell != holder:
                self._switch(cell, ROLLOUT, self.w.training_to_rollout_s)
        self.round_members = ()
        self._maybe_start_round()
        if not self.in_round and not self.in_update:
            self.starved_since = self.now

    def _step_complete(self) -> bool:
        return self.pending_tokens == 0 and self.step_groups == self.w.groups_per_step

    def _update_holder(self) -> int | None:
        """The training cell that runs the update: one staying in training if any, else one told
        to leave (it leaves when the update is published); None while no cell trains."""
        staying = [c for c in self.training if not self.cells[c].leaving]
        return min(staying or self.training, default=None)

    def _start_update(self) -> None:
        holder = self._update_holder()
        if holder is None:
            return  # a cell switching in to train will start it
        self.update_cell = holder
        self.in_update = True
        self.starved_since = None
        self.training_busy += self.w.step_overhead_s
        self._at(self.now + self.w.step_overhead_s, _UPDATE_END, 0)

    def _update_end(self) -> None:
        self.in_update = False
        holder, self.update_cell = self.update_cell, -1
        if self.cells[holder].leaving:
            self._switch(holder, ROLLOUT, self.w.training_to_rollout_s)
        self.version += 1
        self.step_groups = 0
        self.step_end.append(self.now)
        self.starved_since = self.now

    # -- result ---------------------------------------------------------------------------------

    def _result(self) -> Result:
        for cell, c in enumerate(self.cells):
            self._close(cell)
            if c.role == SWITCHING:  # count only the part of a switch that happened
                self.switching -= self._switch_remaining(cell)
        return Result(
            wall_s=self.now,
            num_cells=self.w.cells,
            rollout_busy_s=self.rollout_busy,
            training_busy_s=self.training_busy,
            switching_s=self.switching,
            sync_s=self.sync,
            num_switches=self.num_switches,
            migrations=self.migrations,
            steps=self.version,
            executions=sum(1 for g in self.group_left if g == 0) * self.w.group_size,
            timeouts=sum(self.x.timed_out),
            staleness=self.staleness,
            step_end_s=self.step_end,
            timeline=self.timeline,
            hosting=self.hosting,
            rounds=self.rounds,
            trained_tokens=self.trained_tokens,
            paused_s=self.paused,
            admitted_by_version=admitted_by_version(self.group_version[: self.admitted], self.w.steps),
        )

    def _switch_remaining(self, cell: int) -> float:
        ends = [t for t, _, kind, ref, _ in self.heap if kind == _SWITCH_END and ref == cell]
        return max(0.0, max(ends, default=self.now) - self.now)
