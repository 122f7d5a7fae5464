"""The FIFO path bound: the longest path of publication edges, minimised over admission
sequences by dynamic programming (pure).

Notation as in `chain_bound.py`: P_v is the time version v is published (P_0 = 0, the run ends
at P_S), a(v) the number of groups admitted at versions <= v (a(-1) = 0), batch v the groups
a(v-1) .. a(v)-1 of the queue (n_v of them), c_g = D_g + w_g / C, and
(v + 1) * B <= a(v) <= (v + K + 1) * B, a(S-1) = S * B.

**Edges.** For every version s and hop j in 1..K+1, landing at L = min(s + j, S):

    P_L >= P_s + max((L - s) * O,  O + the (e + 1)-th costliest c_g of batch s)

(0 if e >= n_s), where e = a(s + j - 1) - (s + j) * B for j <= K and L < S, else e = 0.
Proof: e bounds how many of batch s's groups are still untrained after step L - 1. Steps
0 .. L-1 train L * B groups, each admitted at a version <= L - 1, of which at most
a(L - 1) - n_s come from other batches; so at least n_s - e of batch s are trained by step L - 1
(all of them when j = K + 1, by the staleness limit, or when L = S, the run's end). The
costliest of those is at least the (e + 1)-th costliest of the batch; it was admitted at or
after P_s, ready D_g later, its tokens took at least w_g / C on C cells, and the step that
trained it, at most L - 1, published O after that, no later than P_L. Publications are
O apart at least, hence (L - s) * O. j = 1 is `chain_bound`'s walk, j = K + 1 its jump; the
hops j = 2 .. K between them depend on a later admission count, a(s + j - 1).

**Minimisation.** For a fixed admission sequence a, P_S is at least the longest path of these
edges from 0 to S, L_S(a), so the wall time is at least min over feasible a of L_S(a). A
table l_u over the last K + 1 admission counts (a(u-K-1) .. a(u-1)) holds a value no larger
than L_u(a) for every a that ends with them: l_0 = 0, and l_{u+1} is the smallest, over
a(u-K-1), of the largest over the edges landing at u + 1 of (l_s with its older counts
minimised away) + the edge. By induction each l_u is at most L_u(a), so min l_S bounds every
schedule. Unlike the game of `chain_bound`, the path is chosen knowing every batch; what is lost
is that the minimisations of different l_s may pick different older counts.

Edges from version 0 may use `first_costs` instead (`bound.first_batch_costs`: with P_0 = 0,
a group's readiness may also count the wait for a rollout slot).

Each admission count takes up to K * B + 1 values, so the work grows as (K B)^(K+2) * S;
past `MAX_CELLS` the term is not computed (None).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

MAX_CELLS = 3e9  # table cells visited, all versions together (short-math: 1.8e9, ~7 s)


def descending(costs: np.ndarray, starts: range, ends: range) -> np.ndarray:
    """T[i, k, r]: the (r + 1)-th largest of costs[starts[i]:ends[k]], 0 past the batch (the last
    column is always 0).

    Example: costs [3, 1, 2], starts 0..1, ends 2..3 -> T[0, 1] = [3, 2, 1, 0], T[1, 0] = [1, 0, 0, 0]
    """
    width = max(0, ends[-1] - starts[0])
    table = np.zeros((len(starts), len(ends), width + 1))
    end_at = np.asarray(ends)
    for i, s in enumerate(starts):
        values = costs[s : ends[-1]]
        inside = np.arange(len(values))[None, :] < (end_at - s)[:, None]
        ordered = -np.sort(-np.where(inside, values[None, :], -np.inf), axis=1)
        table[i, :, : len(values)] = np.where(np.isfinite(ordered), ordered, 0.0)
    return table


def edge(
    batch_desc: Sequence[float], *, source: int, hop: int, steps: int, untrained: int, overhead_s: float
) -> float:
    """The edge from version `source` over `hop` versions (module docstring), given batch
    `source`'s costs largest first and how many of them may still be untrained at its landing.

    Example: batch [9, 5, 1], hop 2 from version 3 of 10, 1 untrained, O = 2 -> max(4, 2 + 5) = 7
    """
    land = min(source + hop, steps)
    kth = batch_desc[untrained] if untrained < len(batch_desc) else 0.0
    return max((land - source) * overhead_s, overhead_s + kth)


def longest_path(
    *,
    costs: Sequence[float],
    admitted: Sequence[int],
    groups_per_step: int,
    max_staleness: int,
    overhead_s: float,
    first_costs: Sequence[float] | None = None,
) -> float:
    """L_S(a): the longest edge path for one admission sequence `admitted` (a(0) .. a(S-1)), a
    lower bound on the wall time of every schedule that admits exactly so.

    Example: c = [1, 5, 5], a = (3, 3, 3), B=1, K=2, O=1 -> hop 0 -> 2 (5 + 1), walk 2 -> 3: 7.0
    """
    steps, b, k = len(admitted), groups_per_step, max_staleness
    length = [0.0] + [-math.inf] * steps
    for s in range(steps):
        source = costs if s or first_costs is None else first_costs
        batch = sorted(source[(admitted[s - 1] if s else 0) : admitted[s]], reverse=True)
        for j in range(1, k + 2):
            land = min(s + j, steps)
            untrained = 0 if (j == k + 1 or land == steps) else admitted[s + j - 1] - (s + j) * b
            cost = edge(batch, source=s, hop=j, steps=steps, untrained=untrained, overhead_s=overhead_s)
            length[land] = max(length[land], length[s] + cost)
    return length[steps]


def at_cap(*, steps: int, groups_per_step: int, max_staleness: int) -> list[int]:
    """The admission sequence of every policy that admits as soon as the staleness cap allows:
    a(v) = min((v + K + 1) * B, S * B).

    Example: S=3, B=2, K=1 -> [4, 6, 6]
    """
    n = steps * groups_per_step
    return [min((v + max_staleness + 1) * groups_per_step, n) for v in range(steps)]


def fifo_paths(
    *,
    costs: Sequence[float],
    steps: int,
    groups_per_step: int,
    max_staleness: int,
    overhead_s: float,
    first_costs: Sequence[float] | None = None,
) -> float | None:
    """min over admission sequences of the longest edge path (module docstring); None if too big.

    Example (B=1, K=2, S=3, c = [1, 5, 5], O = 1): admitting all three groups at version 0
    leaves at most a(1) - 2 = 1 of them untrained after step 1, so the hop 0 -> 2 costs 5 + 1 and
    P_3 >= 7; a(0) = 2 walks to 1 (P_1 >= 2) and jumps over the 5 of batch 1: 8; a(0) = 1
    walks over a 5 from 1: 9 -> 7.0 (`chain_bound.fifo_chain`, committing to a path before
    a(1) is known, gives 6.0).
    """
    c = np.asarray(costs, dtype=float)
    c0 = np.asarray(first_costs if first_costs is not None else costs, dtype=float)
    n, b, k, o = len(c), groups_per_step, max_staleness, overhead_s
    assert n == steps * b

    def counts(v: int) -> range:  # the values a(v) may take
        if v < 0:
            return range(0, 1)
        if v >= steps - 1:
            return range(n, n + 1)
        return range((v + 1) * b, min((v + k + 1) * b, n) + 1)

    size = sum(float(np.prod([len(counts(u - d)) for d in range(k + 2)])) for u in range(steps))
    if size > MAX_CELLS:
        return None
    tables: dict[int, np.ndarray] = {}  # batch s: descending(c, counts(s-1), counts(s))
    ell: dict[int, np.ndarray] = {0: np.zeros((1,) * (k + 1))}  # over a(u-k-1) .. a(u-1)
    for u in range(steps):
        tables[u] = descending(c if u or first_costs is None else c0, counts(u - 1), counts(u))
        window = [counts(u - k - 1 + d) for d in range(k + 1)]  # a(u-k-1) .. a(u-1)
        # Monotone admission counts: a(u-k-1) <= ... <= a(u-1).
        valid = np.ones([len(r) for r in window], dtype=bool)
        for d in range(k):
            lower = np.asarray(window[d]).reshape([-1 if e == d else 1 for e in range(k + 1)])
            upper = np.asarray(window[d + 1]).reshape([-1 if e == d + 1 else 1 for e in range(k + 1)])
            valid &= lower <= upper
        # l_s for each source s = u + 1 - j, its counts older than a(u-k-1) minimised away, laid
        # out over window dims 0 .. k+1-j.
        sources: list[tuple[int, int, np.ndarray]] = []
        for j in range(1, k + 2):
            s = u + 1 - j
            if s < 0:
                continue
            held = ell[s].min(axis=tuple(range(j - 1))) if j > 1 else ell[s]
            sources.append((j, s, held.reshape(held.shape + (1,) * (j - 1))))
        last = counts(u)
        new = np.full([len(r) for r in window[1:]] + [len(last)], np.inf)
        for i, a_u in enumerate(last):
            best = np.full(valid.shape, -np.inf)
            for j, s, held in sources:
                table = tables[s]
                untrained = 0 if (j == k + 1 or u + 1 >= steps) else a_u - (u + 1) * b
                if j == 1:
                    # batch u = a(u-1) .. a_u: over window dim k
                    sizes = a_u - np.asarray(window[k])
                    ranks = np.where(untrained < sizes, untrained, table.shape[2] - 1)
                    picked = table[np.arange(len(window[k])), i, ranks]
                    weight = picked.reshape([1] * k + [-1])
                else:
                    # batch s = a(s-1) .. a(s): window dims k+1-j and k+2-j
                    first, second = window[k + 1 - j], window[k + 2 - j]
                    sizes = np.asarray(second)[None, :] - np.asarray(first)[:, None]
                    rank = min(untrained, table.shape[2] - 1)
                    picked = np.where(rank < sizes, table[:, :, rank], 0.0)
                    weight = picked.reshape([1] * (k + 1 - j) + list(picked.shape) + [1] * (j - 2))
                best = np.maximum(best, held + np.maximum(j * o, o + weight))
            ok = valid & (np.asarray(window[k]) <= a_u).reshape([1] * k + [-1])
            new[..., i] = np.where(ok, best, np.inf).min(axis=0)
        ell[u + 1] = new
        ell.pop(u - k, None)
        tables.pop(u - k, None)
    return float(ell[steps].min())
