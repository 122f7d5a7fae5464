"""Each fixed-split mode's best split, found by a sweep of simulations, in one process or several
(shell: the pool is the only side effect; every run is the pure, deterministic `simulate_within`).

The sweep (`best_split`'s contract): every split of `sweep_splits`, the workload's own always
included; then every split between the best one's neighbours in it, so the best is exhaustive
near the optimum. Example (32 cells): 24 splits 1, 2, 4, ..., 31; best 19 of neighbours 18 and
21 -> 20 is tried too.

A split is simulated only until it is certain to be slower than the best so far (`past_s`): it
can then be neither the best nor tied with it (ties go to the fewer rollout cells), so the answer
is the one simulating every split to its end gives, whatever order the runs end in. The
workload's own split goes first and the rest nearest to it first, so the best so far is good
early and far splits stop soon. With `jobs` > 1 the runs of all the modes' sweeps share a pool
of processes; a run takes the best so far when it starts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field

from services.scheduler.sim.modes import simulate_within
from services.scheduler.sim.result import Result
from services.scheduler.sim.workload import Executions, Workload


def sweep_splits(cells: int, *, most: int = 24) -> Sequence[int]:
    """Rollout-pool sizes a sweep tries first: all of 1..cells-1, or `most` spread evenly."""
    if cells - 1 <= most:
        return range(1, cells)
    step = (cells - 2) / (most - 1)
    return sorted({1 + round(i * step) for i in range(most)})


@dataclass(slots=True)
class _Sweep:
    """One mode's sweep: the splits still to run, and every split's wall time so far."""

    mode: str
    own: int
    feasible: range
    todo: list[int] = field(default_factory=list)
    walls: dict[int, float] = field(default_factory=dict)  # inf: stopped as slower than the best
    results: dict[int, Result] = field(default_factory=dict)
    running: int = 0
    refined: bool = False

    def plan(self, splits: Sequence[int]) -> None:
        wanted = {a for a in splits if a in self.feasible and a not in self.walls}
        self.todo = sorted(wanted, key=lambda a: (abs(a - self.own), a))

    def past_s(self) -> float:
        best = self.best()
        return math.inf if best is None else self.walls[best]

    def best(self) -> int | None:
        return min(self.results, key=lambda a: (self.walls[a], a), default=None)

    def record(self, split: int, result: Result | None) -> None:
        self.walls[split] = math.inf if result is None else result.wall_s
        if result is not None:
            self.results[split] = result

    def next_stage(self) -> bool:
        """After the spread sweep, plan the refinement; False once both are done."""
        if self.todo or self.running:
            return True
        if self.refined:
            return False
        self.refined = True
        tried = sorted(self.walls)
        i = tried.index(min(tried, key=lambda a: (self.walls[a], a)))
        low, high = tried[max(0, i - 1)], tried[min(len(tried) - 1, i + 1)]
        self.plan(range(low + 1, high))
        return bool(self.todo)


def best_splits(
    modes: Sequence[str], w: Workload, x: Executions, *, known: dict[str, Result], jobs: int = 1
) -> dict[str, tuple[int, Result]]:
    """Each mode's best split and its run; `known[mode]` is its run at the workload's split."""
    feasible = range(max(1, math.ceil(w.group_size / w.executions_per_cell)), w.cells)
    sweeps = [_Sweep(mode=m, own=w.async_rollout_cells, feasible=feasible) for m in modes]
    for s in sweeps:
        if s.mode in known and s.own in feasible:
            s.record(s.own, known[s.mode])
        # The workload's own split is always tried, so a mode at its best is never slower than at it.
        s.plan([*sweep_splits(w.cells), s.own])
    if jobs <= 1:
        for s in sweeps:
            while s.next_stage():
                split = s.todo.pop(0)
                s.record(split, simulate_within(s.mode, w, x, s.past_s(), rollout_cells=split))
    else:
        _run_in_pool(sweeps, w, x, jobs)
    out: dict[str, tuple[int, Result]] = {}
    for s in sweeps:
        best = s.best()
        assert best is not None
        out[s.mode] = (best, s.results[best])
    return out


def _run_in_pool(sweeps: list[_Sweep], w: Workload, x: Executions, jobs: int) -> None:
    in_flight: dict[Future[Result | None], tuple[_Sweep, int]] = {}
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        while True:
            live = [s for s in sweeps if s.next_stage()]
            if not live and not in_flight:
                return
            # Round-robin over the modes so each one's best so far improves early.
            for s in live * jobs:
                if len(in_flight) >= jobs:
                    break
                if s.todo:
                    split = s.todo.pop(0)
                    s.running += 1
                    future = pool.submit(simulate_within, s.mode, w, x, s.past_s(), rollout_cells=split)
                    in_flight[future] = (s, split)
            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
            for future in done:
                s, split = in_flight.pop(future)
                s.running -= 1
                s.record(split, future.result())
