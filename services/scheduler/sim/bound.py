"""A lower bound on the wall time of *any* schedule of a workload's executions (pure).

The model every term assumes (the simulator's, and any other schedule's under it): a cell does one
thing at a time; a rollout cell runs at most E executions; an execution runs for its drawn
(timeout-capped) duration d_i once started; training is perfectly divisible across cells at r
tokens/s each; step j trains with the weights of version j, so only in [P_j, P_{j+1} - O], where
P_j is the time version j is published (P_0 = 0) and O the update; the run ends at P_S or later.
Role switches, migrations and microbatch rounding cost nothing unless a term says so. Notation:
C cells, S steps, B groups per step, K max staleness; group g is ready no earlier than D_g (the
max of its d_i) after admission; R = sum(d_i) / E rollout cell-seconds, W = sum(t_i) / r training
cell-seconds, w_g = group g's training cell-seconds.

- **work**: every cell-second is spent on at most one thing: R, W, the S updates (O on the cell
  doing each), or nothing. During the *last* update nothing else can run (every execution has
  finished, since its group was trained before that update, and no step is left to train), so
  C - 1 cells are idle for O:  wall >= (R + W + S*O + (C-1)*O) / C.
- **training window**: no training happens before the first group is ready (min_g D_g) nor
  during any of the S updates, and W needs W / C seconds on all cells:
  wall >= min_g D_g + S*O + W / C.
- **last group**: a group is ready no earlier than D_g, its tokens then need w_g / C at least
  and its step's update O after that:  wall >= max_g (D_g + w_g / C + O).
- **staleness chain**: a group trained in step k was admitted at version >= k - K, so after
  update k-K-1 was published; it is ready D_g later, and update k ends O after its step's last
  group. So P_{k+1} >= P_{k-K} + M_k + O, with M_k the largest D_g of step k's groups. Summed
  along each of the K+1 chains of steps k = rho, rho+K+1, ...: wall >= (sum_k M_k + S*O) / (K+1).
  Whatever the grouping into steps, the j-th largest M_k is at least the (j*B+1)-th largest D_g
  (the top j*B+1 groups span at least j+1 steps), so sum_k M_k >= sum_j D_desc[j*B].
- **update gaps**: let n_j be the number of cells that train in step j, and w0 = min(O,
  rollout_to_training_s, min_g D_g). For each pair (cell c, step j it trains in) take the
  interval from the end of c's previous training (or time 0) to c's first training in step j.
  These intervals are disjoint per cell, and c trains in none of them. Unless c performs an
  update inside it (each update lies inside at most one such interval: it falls between c's
  trainings of two steps), c wastes at least w0 there: if c trained before, the interval spans at
  least O (the steps' training windows are O apart), so c either stays in the training role with
  nothing to do for >= O or leaves it and comes back, paying rollout_to_training_s; if c never
  trained before, it either held the training role idle since 0 (>= min_g D_g, nothing trains
  earlier) or switched in (rollout_to_training_s). Adding this waste to the work term:
      (A)  C * wall >= R + W + S*O + (C-1)*O + w0 * (sum_j n_j - S).
  Step j's training needs W_j / n_j inside its window, so
      (B)  wall >= min_g D_g + sum_j (W_j / n_j + O),       1 <= n_j <= C.
  A schedule chooses n_j and which groups form each step, trading (A) against (B); for every
  lam in [0, 1], wall >= lam*(A)/C + (1-lam)*(B), minimised over all choices. That minimum
  separates by step into h(W_j) = min over real n in [1, C] of lam*w0*n/C + (1-lam)*W_j/n (a
  minimum of affine nondecreasing functions, so concave and nondecreasing), summed over steps.
  A sum of a concave function over the step totals is smallest for the grouping whose step
  totals majorise every other's: the groups sorted by cost and cut into consecutive runs of B
  (any grouping's k largest steps hold at most the k*B largest groups). The term is the largest
  of these bounds over a grid of lam (each lam alone is a valid bound).

- **fifo_chain** (`chain_bound.py`, proved there): the staleness chain again, using that the
  task queue is first in, first out, so the groups admitted at one version are a contiguous run
  of the queue; minimised over admission sequences by dynamic programming.

- **fifo_paths** (`path_bound.py`, proved there): the same edges plus the hops between a walk
  and a jump (step s+j-1 cannot publish before the (e+1)-th costliest group of batch s is
  trained, e = a(s+j-1) - (s+j)*B of them may still be untrained), the longest path taken with
  every batch known and minimised over admission sequences by dynamic programming over the last
  K+1 admission counts. Not computed past `path_bound.MAX_CELLS` (the 1,024-cell case).

- **all_reduce**: the engine trains in lockstep rounds, one at a time; a round of n >= 2 members
  trains at most n * microbatch tokens and ends with a ring all-reduce of 2(n-1)/n * beta seconds
  (beta = replica bytes / link) on every member: 2(n-1) * beta >= n * beta cell-seconds, so at
  least s = beta / microbatch cell-seconds per token it trains, disjoint from R, W and the
  updates. A round of one member pays none but trains at r tokens/s on one cell. With T1 of the
  T tokens trained in one-member rounds:
      C * wall >= R + W + S*O + (C-1)*O + (T - T1) * s        (the work term, plus all-reduce)
      wall >= min_g D_g + S*O + T1 / r + (T - T1) / (C r)     (rounds are sequential)
  The first falls and the second rises with T1, so the term is the larger of the two where
  they cross (or at an end of [0, T]).

lower_bound_s is the largest of the eight. What it still leaves out, so what no schedule can
avoid but the bound does not charge: the non-clairvoyant rollout tail (the task queue is FIFO, but
the bound may group groups as a clairvoyant schedule would), slot fragmentation (a group starts
only when G slots are free), staleness waits beyond the chain, and migration pauses.
"""

from __future__ import annotations

import bisect
import math
from typing import Any

from services.scheduler.sim.chain_bound import fifo_chain
from services.scheduler.sim.path_bound import at_cap, fifo_paths, longest_path
from services.scheduler.sim.workload import Executions, Workload

LAMBDA_GRID = 200


def update_gaps(
    *,
    cells: int,
    rollout_s: float,
    step_training_s: list[float],
    overhead_s: float,
    first_ready_s: float,
    rollout_to_training_s: float,
) -> float:
    """The update-gaps term: max over lam of lam*(A)/C + (1-lam)*(B), minimised over n_j and steps.

    `step_training_s` are the per-step training cell-seconds of the most spread grouping (groups
    sorted by cost, cut into runs of B).

    Example: 4 cells, two steps of 80 training cell-s, 400 rollout cell-s, O = 4, first group
    ready at 10 s, switch-in 8 s, so w0 = 4. With n cells per step, (A)/C = 145 + 2(n - 1) and
    (B) = 18 + 160/n; they meet at n = 1.255: 145.51 s, above the work term's 145 s.
    """
    c, s, o = cells, len(step_training_s), overhead_s
    w0 = max(0.0, min(o, rollout_to_training_s, first_ready_s))
    training = sum(step_training_s)
    best = 0.0
    for i in range(LAMBDA_GRID + 1):
        lam = i / LAMBDA_GRID
        fixed = lam * (rollout_s + training + s * o + (c - 1) * o - w0 * s) / c + (1 - lam) * (
            first_ready_s + s * o
        )
        per_step = 0.0
        for w in step_training_s:
            if lam * w0 > 0:
                n = min(float(c), max(1.0, math.sqrt((1 - lam) * w * c / (lam * w0))))
            else:
                n = float(c)
            per_step += lam * w0 * n / c + (1 - lam) * w / n
        best = max(best, fixed + per_step)
    return best


def all_reduce(
    *, work_s: float, window_s: float, cells: int, tokens: int, tokens_per_s: float, sync_s_per_token: float
) -> float:
    """The all-reduce term: min over T1 in [0, T] of max((work + (T - T1) * s) / C,
    window + T1 / r + (T - T1) / (C * r)), the two sides being linear in T1.

    Example: work 100 cell-s, window 10 s, 2 cells, 100 tokens at 10 tokens/s, s = 0.2 cell-s
    per token: (120 - 0.2 T1) / 2 = 15 + 0.05 T1 at T1 = 300 > T, so T1 = T = 100:
    max(50, 20) = 50; s = 0 -> 50 (the work term alone).
    """
    c, t, r, s = cells, float(tokens), tokens_per_s, sync_s_per_token

    def sides(t1: float) -> tuple[float, float]:
        return (work_s + (t - t1) * s) / c, window_s + t1 / r + (t - t1) / (c * r)

    # (work + (t - t1) s) / c = window + t1 / r + (t - t1) / (c r), solved for t1.
    slope = s / c + 1 / r - 1 / (c * r)
    crossing = ((work_s + t * s) / c - window_s - t / (c * r)) / slope if slope > 0 else t
    t1 = min(t, max(0.0, crossing))
    return max(sides(t1))


def group_costs(w: Workload, x: Executions) -> list[float]:
    """c_g = D_g + w_g / C per group in queue order: its slowest execution, then its tokens
    trained on every cell (the chain terms' cost of a group)."""
    g, r = w.group_size, w.tokens_per_s_per_cell
    return [
        max(x.duration_s[k * g : k * g + g]) + sum(x.tokens[k * g : k * g + g]) / r / w.cells
        for k in range(w.total_groups)
    ]


def first_batch_costs(w: Workload, x: Executions) -> list[float]:
    """c_g for the groups a path's edges from version 0 (P_0 = 0) may cover: the slowest of
    (S_e + d_e) over the group's executions, plus w_g / C, where S_e is the earliest execution e
    can start. Executions start in queue order and at most C * E run at once, so when e starts
    every earlier one has started, at most C*E - 1 of them still run, and at least e - C*E + 1
    have finished: S_e >= the (e - C*E + 1)-th smallest d_j over j < e (0 while e < C*E).
    Only the first (K+1)*B groups can be in batch 0; the rest keep c_g.

    Example: 1 cell of 2 slots, durations 5, 1, 3, 2: S = 0, 0, 1 (after the 1 s), 3 (after
    1 and 3) -> executions end by 5, 1, 4, 5
    """
    g, slots = w.group_size, w.cells * w.executions_per_cell
    first = min(w.total_groups, (w.max_staleness + 1) * w.groups_per_step) * g
    finished: list[float] = []
    ends: list[float] = []
    for e in range(first):
        rank = e - slots + 1
        ends.append((finished[rank - 1] if rank > 0 else 0.0) + x.duration_s[e])
        bisect.insort(finished, x.duration_s[e])
    costs = group_costs(w, x)
    for k in range(first // g):
        costs[k] += max(ends[k * g : k * g + g]) - max(x.duration_s[k * g : k * g + g])
    return costs


def admission_bound(w: Workload, x: Executions, admitted: list[int]) -> float:
    """`path_bound.longest_path` for one admission sequence: no schedule that admits exactly so
    (`path_bound.at_cap`: every policy admitting as the staleness cap allows) ends sooner."""
    return longest_path(
        costs=group_costs(w, x),
        first_costs=first_batch_costs(w, x),
        admitted=admitted,
        groups_per_step=w.groups_per_step,
        max_staleness=w.max_staleness,
        overhead_s=w.step_overhead_s,
    )


def cap_admission_bound(w: Workload, x: Executions) -> float:
    """A lower bound on every schedule that admits as the staleness cap allows, a(v) =
    min((v+K+1)*B, S*B) (`path_bound.at_cap`): the larger of that sequence's longest path and
    a recurrence over its steps' publication times.

    With that sequence, for t >= K the groups due by step t (admitted at versions <= t-K) number
    a(t-K) = (t+1)*B, exactly what steps 0..t train, and they are the first (t+1)*B of the queue;
    so for t >= K+1 step t trains exactly groups t*B .. (t+1)*B-1, all of batch t-K, while steps
    0..K share batch 0 ((K+1)*B groups) in some way. Recurrence, P_0 = 0:
    - t <= K: steps 0..t have trained (t+1)*B groups of batch 0 by P_{t+1} - O, so
      P_{t+1} >= max(P_t + O, O + the ((t+1)*B)-th smallest c_g of batch 0, with the start
      limit of `first_batch_costs`);
    - t >= K+1: group g of step t is admitted at or after P_{t-K} and ready D_g later; step t
      trains only after P_t (it needs version t), its tokens take w_g cell-seconds on at most C
      cells, and P_{t+1} is O after the last. With release r_g = max(P_t, P_{t-K} + D_g), for
      every threshold the work released at or after it is done after it:
      P_{t+1} >= O + max over g of (r_g + (sum of w_j with r_j >= r_g) / C).
    Each P bound uses only bounds on earlier ones (all nondecreasing in them), so P_S bounds the
    wall time of every schedule in the class.

    Example: S=2, B=1, K=0, C=1, O=1, groups ready after 5 and 2 with 3 cell-s of training each:
    P_1 >= 1 + 5 + 3 = 9 (t = 0 <= K), P_2 >= 1 + max(9, 9 + 2) + 3 = 15
    """
    g, b, k, o = w.group_size, w.groups_per_step, w.max_staleness, w.step_overhead_s
    ready = [max(x.duration_s[i * g : i * g + g]) for i in range(w.total_groups)]
    work = [sum(x.tokens[i * g : i * g + g]) / w.tokens_per_s_per_cell for i in range(w.total_groups)]
    batch0 = sorted(first_batch_costs(w, x)[: min(w.total_groups, (k + 1) * b)])
    published = [0.0]
    for t in range(w.steps):
        if t <= k:
            nth = batch0[min(len(batch0), (t + 1) * b) - 1]
            published.append(max(published[t] + o, o + nth))
            continue
        released = sorted(
            (max(published[t], published[t - k] + ready[i]), work[i]) for i in range(t * b, (t + 1) * b)
        )
        last, after = 0.0, 0.0
        for release, cell_s in reversed(released):
            after += cell_s
            last = max(last, release + after / w.cells)
        published.append(last + o)
    cap = at_cap(steps=w.steps, groups_per_step=b, max_staleness=k)
    return max(published[-1], admission_bound(w, x, cap))


def lower_bounds(w: Workload, x: Executions) -> dict[str, float]:
    c, e, r = w.cells, w.executions_per_cell, w.tokens_per_s_per_cell
    g, b = w.group_size, w.groups_per_step
    rollout = sum(x.duration_s) / e
    training = sum(x.tokens) / r
    overhead = w.steps * w.step_overhead_s
    ready = [max(x.duration_s[k * g : k * g + g]) for k in range(w.total_groups)]
    group_training = [sum(x.tokens[k * g : k * g + g]) / r for k in range(w.total_groups)]
    by_cost = sorted(group_training)
    work_cell_s = rollout + training + overhead + (c - 1) * w.step_overhead_s
    chain: dict[str, Any] = {
        "costs": group_costs(w, x),
        "steps": w.steps,
        "groups_per_step": b,
        "max_staleness": w.max_staleness,
        "overhead_s": w.step_overhead_s,
    }
    paths = fifo_paths(**chain, first_costs=first_batch_costs(w, x))
    terms = {
        "work": work_cell_s / c,
        "training_window": min(ready) + overhead + training / c,
        "staleness_chain": (sum(sorted(ready, reverse=True)[j * b] for j in range(w.steps)) + overhead)
        / (w.max_staleness + 1),
        "last_group": max(d + t / c + w.step_overhead_s for d, t in zip(ready, group_training, strict=True)),
        "update_gaps": update_gaps(
            cells=c,
            rollout_s=rollout,
            step_training_s=[sum(by_cost[j * b : j * b + b]) for j in range(w.steps)],
            overhead_s=w.step_overhead_s,
            first_ready_s=min(ready),
            rollout_to_training_s=w.rollout_to_training_s,
        ),
        "all_reduce": all_reduce(
            work_s=work_cell_s,
            window_s=min(ready) + overhead,
            cells=c,
            tokens=sum(x.tokens),
            tokens_per_s=r,
            sync_s_per_token=w.replica_bytes / w.link_bytes_per_s / w.microbatch_tokens,
        ),
        "fifo_chain": fifo_chain(**chain),
    }
    if paths is not None:
        terms["fifo_paths"] = paths
    return terms


def lower_bound_s(w: Workload, x: Executions) -> float:
    return max(lower_bounds(w, x).values())
