"""The FIFO staleness-chain lower bound, by dynamic programming over admission sequences (pure).

The plain staleness chain (`bound.py`) must allow any grouping of groups into steps, and averages
over its K + 1 chains. Under the simulator's rules the task queue is first in, first out, so the
groups that share an admission version are a contiguous run of the queue, and a chain of
publication times can follow whichever batches are heavy. Notation as in `bound.py`; P_v is the
time version v is published (P_0 = 0; the run ends at P_S), a(v) the number of groups admitted at
versions <= v (a(-1) = 0), and c_g = D_g + w_g / C for group g in queue order: its slowest
execution, then its tokens trained on every cell.

Facts every schedule obeys, and why:
1. Versions are non-decreasing along the queue, so batch v (the groups admitted at version v) is
   the run of groups a(v-1) .. a(v)-1.
2. (v + 1) * B <= a(v) <= (v + K + 1) * B, and a(S-1) = S * B: step v trains B groups, each
   admitted at a version <= v; every group admitted at a version <= v is trained by step v + K
   (the staleness limit), in the (v + K + 1) * B places of steps 0..v+K; the last step is S - 1.
3. A group g of batch v is admitted at or after P_v and its executions start no earlier, so it is
   ready at P_v + D_g or later; its tokens then take at least w_g / C; the step that trains it is
   published O after its last training. A group of batch v is trained in a step from v to v + K.
4. **Jump edge.** By 3, P_min(v+K+1, S) >= P_v + M_v + O, with M_v the largest c_g of batch v
   (0 if it is empty); and P_min(v+K+1, S) >= P_v + (number of updates between) * O.
5. **Walk edge.** Steps 0..v train (v + 1) * B groups and only a(v-1) were admitted before
   version v, so at least m_v = (v + 1) * B - a(v-1) groups of batch v are trained in step v
   itself: P_{v+1} >= P_v + O + (the m_v-th smallest c_g of batch v), or P_v + O if m_v <= 0.

Any path of jump and walk edges from version 0 to S bounds the wall time. The term is the value
of a game in which the schedule chooses a(v) version by version (fact 2) and the path, seeing
only the batches chosen so far, walks or jumps from each version it stands on: for every real
schedule the path that plays this game's strategy is a real path, so its length is a lower
bound, and the schedule's best play (the game value) bounds every schedule. Dynamic programming
over (version, groups admitted before it, versions the path is still jumping over) computes it.

Example (B=1, K=0, S=2, c = [5, 1], O = 1): a(0) = 1 and a(1) = 2 are forced; every edge is a
jump of one version: 5 + 1 and 1 + 1, so wall >= 8.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np


def running_mth_smallest(values: Sequence[float], m: int) -> list[float]:
    """For each prefix values[:i+1], its m-th smallest value (0 while the prefix is shorter).

    Example: values [4, 1, 3, 2], m = 2 -> [0, 4, 3, 2]
    """
    largest_of_smallest: list[float] = []  # negated: a max-heap of the m smallest so far
    out: list[float] = []
    for value in values:
        if len(largest_of_smallest) < m:
            heapq.heappush(largest_of_smallest, -value)
        elif value < -largest_of_smallest[0]:
            heapq.heapreplace(largest_of_smallest, -value)
        out.append(-largest_of_smallest[0] if len(largest_of_smallest) == m else 0.0)
    return out


def fifo_chain(
    *, costs: Sequence[float], steps: int, groups_per_step: int, max_staleness: int, overhead_s: float
) -> float:
    """The game value of the module docstring: a lower bound on the wall time of any schedule.

    Example: costs [5, 1], 2 steps, B=1, K=0, O=1 -> 8.0
    """
    c = np.asarray(costs, dtype=float)
    n, b, k, o = len(c), groups_per_step, max_staleness, overhead_s
    assert n == steps * b

    def before(v: int) -> tuple[int, int]:  # range of a(v-1)
        return (v * b, min((v + k) * b, n)) if v > 0 else (0, 0)

    # value[p, a - lo]: the rest of the game from version v with a(v-1) = a, the path still
    # jumping over p more versions (p = 0: it stands on v and chooses).
    lo, hi = before(steps)
    value = np.zeros((k + 1, hi - lo + 1))
    for v in range(steps - 1, -1, -1):
        prev_lo, prev_hi = before(v)
        first, last = ((v + 1) * b, min((v + k + 1) * b, n)) if v < steps - 1 else (n, n)
        left = steps - v
        new = np.full((k + 1, prev_hi - prev_lo + 1), np.inf)
        for a_prev in range(prev_lo, prev_hi + 1):
            start = max(a_prev, first)
            if start > last:
                continue
            batch = c[a_prev:last]
            batch_list = costs[a_prev:last]
            maxima = np.concatenate(([0.0], np.maximum.accumulate(batch)))[start - a_prev :]
            after = value[:, start - lo : last - lo + 1]
            must = (v + 1) * b - a_prev
            walk = o + after[0]
            if must > 0:
                walk = (
                    walk + np.array(running_mth_smallest(batch_list, must), dtype=float)[start - a_prev - 1 :]
                )
            if v + k + 1 >= steps:
                jump = np.maximum(maxima + o, left * o)
            else:
                jump = np.maximum(maxima + o, (k + 1) * o) + after[k]
            new[0, a_prev - prev_lo] = np.maximum(walk, jump).min()
            for p in range(1, k + 1):
                new[p, a_prev - prev_lo] = after[p - 1].min()
        value, lo = new, prev_lo
    return float(value[0, 0])
