"""Which rollout cells to free, and where their in-flight requests move (pure).

Freeing a satellite for training means moving its running executions, with their KV cache, to
other rollout cells (DESIGN section 1: no prefix is recomputed). The emptiest cells are freed
first (fewest moves) and requests go to the fullest cells that still have room, so the rollout
pool stays packed and the next cell to free is again cheap.

Freeing k of n cells that hold `total` running executions is possible exactly when
total <= (n - k) * slots, whichever k cells are chosen; so at most n - ceil(total / slots).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    source: int
    target: int
    executions: int


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainPlan:
    freed: tuple[int, ...]
    moves: tuple[Move, ...]


def max_freeable(*, loads: Sequence[int], slots_per_cell: int) -> int:
    """How many of these rollout cells could be emptied by migration right now.

    Example: loads [4, 1, 0, 3], 4 slots -> 8 running need 2 cells -> 2 can be freed.
    """
    return max(0, len(loads) - math.ceil(sum(loads) / slots_per_cell))


def plan_drain(*, loads: dict[int, int], slots_per_cell: int, count: int) -> DrainPlan:
    """Free up to `count` cells of `loads` (cell id -> running executions).

    Example (4 slots):
        loads {1: 4, 2: 1, 3: 0, 4: 3}, count 2
        -> freed (3, 2): cell 3 is empty, cell 2's one request moves to cell 4 (fullest with room)
        -> moves (Move(source=2, target=4, executions=1),)
    """
    k = min(count, max_freeable(loads=list(loads.values()), slots_per_cell=slots_per_cell))
    if k <= 0:
        return DrainPlan(freed=(), moves=())
    by_load = sorted(loads, key=lambda cell: (loads[cell], cell))
    freed, kept = by_load[:k], by_load[k:]
    room = {cell: slots_per_cell - loads[cell] for cell in kept}
    # Fullest first among cells that still have room; ties by id for determinism.
    targets = sorted((c for c in kept if room[c] > 0), key=lambda c: (-loads[c], c))
    moves: list[Move] = []
    cursor = 0
    for source in freed:
        left = loads[source]
        while left > 0:
            target = targets[cursor]
            n = min(left, room[target])
            if n > 0:
                moves.append(Move(source=source, target=target, executions=n))
                room[target] -= n
                left -= n
            if room[target] == 0:
                cursor += 1
    return DrainPlan(freed=tuple(freed), moves=tuple(moves))
