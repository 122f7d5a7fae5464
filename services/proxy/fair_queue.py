"""Which execution's CPU work gets the next free render worker, and how long a refused execution
waits before its next request is read (pure).

Fair queue (start-time fair queuing over worker seconds): each execution has a virtual time, the
worker seconds its jobs have held. When workers are short, the waiting job of the execution with
the least goes first, so one that sends heavy requests waits behind those that send light ones,
however many connections it opens. An execution that starts (or comes back from idling) begins at
the clock, the virtual time of the job started last: idling earns no credit to spend later.

Example (one worker): H's jobs have held it 0.5 s, L's 0.01 s; both wait -> L's goes first.

Refusal backoff: a request the proxy refuses for its input (a 4xx) cost the proxy work and bought
the sender nothing. A harness rarely sends one; a policy flooding the proxy with bodies just over
a bound sends little else. So each refusal in a row makes the execution's next request wait longer
before it is read (doubling, capped), and an accepted request resets it: refusals cost the
sender's time, not the neighbours'.

Example: base 0.01 s, cap 1 s -> waits 0.01, 0.02, 0.04, ... 0.64, 1, 1 s after 1, 2, 3, ... refusals.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True)
class FairQueue(Generic[T]):
    """Jobs of many executions over `workers` workers, least worker time first."""

    workers: int
    busy: int = 0
    clock: float = 0.0
    """The virtual time of the job started last."""
    used: dict[str, float] = field(default_factory=dict)
    """Each execution's virtual time: where its worker seconds have brought it."""
    _waiting: list[tuple[float, int, str, T]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, execution_id: str, item: T) -> None:
        """Queue a job; `start_next` says when it may run."""
        tag = max(self.used.get(execution_id, self.clock), self.clock)
        heapq.heappush(self._waiting, (tag, next(self._order), execution_id, item))

    def start_next(self) -> tuple[str, T] | None:
        """The job to run now, if a worker is free and one waits (the worker is then taken)."""
        if self.busy >= self.workers or not self._waiting:
            return None
        tag, _, execution_id, item = heapq.heappop(self._waiting)
        self.busy += 1
        self.clock = max(self.clock, tag)
        self.used[execution_id] = max(self.used.get(execution_id, tag), tag)
        return execution_id, item

    def done(self, execution_id: str, worker_s: float) -> None:
        """A started job ended after holding its worker `worker_s` seconds (0 if it never ran)."""
        self.busy -= 1
        if execution_id in self.used:
            self.used[execution_id] += max(0.0, worker_s)

    def forget(self, execution_id: str) -> None:
        """The execution ended; jobs of it still queued keep their place."""
        self.used.pop(execution_id, None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)


def refusal_wait_s(refusals_in_a_row: int, *, base_s: float, cap_s: float) -> float:
    """How long an execution's next request waits before it is read, after that many refusals.

    Example: base_s=0.01, cap_s=1.0 -> 0 refusals: 0; 1: 0.01; 3: 0.04; 20: 1.0
    """
    if refusals_in_a_row <= 0 or base_s <= 0:
        return 0.0
    return min(cap_s, base_s * 2 ** min(refusals_in_a_row - 1, 62))
