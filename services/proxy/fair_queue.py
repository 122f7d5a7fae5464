"""Which execution's CPU work gets the next free render worker, and how long a refused execution
waits before its next request is read (pure).

Fair queue (start-time fair queuing over worker seconds): each execution has a virtual time, the
worker seconds its jobs have held. When workers are short, the waiting job of the execution with
the least goes first, so one that sends heavy requests waits behind those that send light ones,
however many connections it opens. An execution that starts (or comes back from idling) begins at
the clock, the virtual time of the job started last: idling earns no credit to spend later.

Example (one worker): H's jobs have held it 0.5 s, L's 0.01 s; both wait -> L's goes first.

Refusal wait: a request the proxy refuses for its input (a 4xx) cost the proxy work and bought the
sender nothing. A harness rarely sends one; a policy flooding the proxy with bodies made to be
refused after the most work sends little else. So after a refusal the execution's next request is
read only once it has waited a multiple of the worker CPU seconds the refused request used: 2x
after one refusal, doubling with each refusal in a row up to 16x, never more than `max_s`. An
accepted request clears it. Refusals then cost the sender's time, not its neighbours': a flood of
them gets at most about 1/17 of a worker, and a harness's odd bad request waits a few
milliseconds.

Example: the refused request used 0.02 s of CPU, max_s 1 -> 0.04 s after 1 refusal in a row,
0.08 after 2, 0.16 after 3, 0.32 after 4 and more; 0.2 s of CPU after 4 -> 1.0 (the cap).
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class FairQueue(Generic[T]):
    """Jobs of many executions over `workers` workers, least worker time first (ties: the job
    queued first). The pick scans the executions with jobs waiting: a few hundred per proxy."""

    workers: int
    busy: int = 0
    clock: float = 0.0
    """The virtual time of the execution whose job started last."""
    used: dict[str, float] = field(default_factory=dict)
    """Each execution's virtual time: where its worker seconds have brought it."""
    _waiting: dict[str, deque[tuple[int, T]]] = field(default_factory=dict)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, execution_id: str, item: T) -> None:
        """Queue a job; `start_next` says when it may run. An execution behind the clock (new,
        or back from idling) is brought up to it."""
        self.used[execution_id] = max(self.used.get(execution_id, self.clock), self.clock)
        self._waiting.setdefault(execution_id, deque()).append((next(self._order), item))

    def start_next(self) -> tuple[str, T] | None:
        """The job to run now, if a worker is free and one waits (the worker is then taken)."""
        if self.busy >= self.workers or not self._waiting:
            return None
        execution_id = min(
            self._waiting, key=lambda e: (self.used.get(e, self.clock), self._waiting[e][0][0])
        )
        jobs = self._waiting[execution_id]
        _, item = jobs.popleft()
        if not jobs:
            del self._waiting[execution_id]
        self.busy += 1
        self.clock = max(self.clock, self.used.get(execution_id, self.clock))
        return execution_id, item

    def done(self, execution_id: str, worker_s: float) -> None:
        """A started job ended after holding its worker `worker_s` seconds (0 if it never ran)."""
        self.busy -= 1
        if execution_id in self.used:
            self.used[execution_id] += max(0.0, worker_s)

    def forget(self, execution_id: str) -> None:
        """The execution ended; jobs of it still queued keep their place."""
        if execution_id not in self._waiting:
            self.used.pop(execution_id, None)

    @property
    def waiting(self) -> int:
        return sum(len(jobs) for jobs in self._waiting.values())


MAX_REFUSAL_FACTOR = 16


def refusal_wait_s(refusals_in_a_row: int, cpu_s: float, *, max_s: float) -> float:
    """How long an execution's next request waits before it is read, after `refusals_in_a_row`
    refusals of which the last used `cpu_s` of worker CPU.

    Example: (1, 0.02, max_s=1.0) -> 0.04; (5, 0.02, max_s=1.0) -> 0.32; (0, 0.02, ...) -> 0
    """
    if refusals_in_a_row <= 0 or max_s <= 0:
        return 0.0
    factor: int = min(2 ** min(refusals_in_a_row, 8), MAX_REFUSAL_FACTOR)
    return float(min(max_s, max(0.0, cpu_s) * factor))
