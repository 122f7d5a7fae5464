"""A lower bound on the wall time of *any* schedule of a workload's executions (pure).

The bound holds for every policy the simulator can run, and for any other schedule under the same
model (a cell does one thing at a time; a rollout cell runs at most E executions; training is
perfectly divisible across cells; role switches, migrations and microbatch rounding are free).
With C cells, E slots, rate r, S steps, overhead O, executions i with (timeout-capped) duration
d_i and tokens t_i, and groups g ready no earlier than D_g = max of their d_i:

- **work**: every cell-second is spent on at most one thing, and the run needs
  R = sum(d_i) / E rollout cell-seconds, W = sum(t_i) / r training cell-seconds and S * O on the
  cell doing each update:  wall >= (R + W + S*O) / C.
- **training window**: no training happens before the first group is ready (min_g D_g) nor
  during any of the S updates (the next step needs the new weights), and W needs W / C seconds on
  all cells:  wall >= min_g D_g + S*O + W / C.
- **last group**: a group is ready no earlier than D_g, its tokens then need t_g / (r*C) at least
  and its step's update O after that:  wall >= max_g (D_g + t_g / (r*C) + O).

- **staleness chain**: a group trained in step k was admitted at version >= k - K, so after
  update k-K-1 was published; it is ready D_g later, and update k ends O after its step's last
  group. So pub(k) >= pub(k-K-1) + M_k + O, with M_k the largest D_g of step k's groups. Summed
  along each of the K+1 chains of steps k = rho, rho+K+1, ...: wall >= (sum_k M_k + S*O) / (K+1).
  Whatever the grouping into steps, the j-th largest M_k is at least the (j*B+1)-th largest D_g
  (the top j*B+1 groups span at least j+1 steps), so sum_k M_k >= sum_j D_desc[j*B].

lower_bound_s is the largest of the four. What it leaves out, so what no schedule can avoid
but the bound does not charge: switch costs, staleness waits, the rollout tail that cannot be
filled when the queue runs dry, and idle training cells during updates.
"""

from __future__ import annotations

from services.scheduler.sim.workload import Executions, Workload


def lower_bounds(w: Workload, x: Executions) -> dict[str, float]:
    c, e, r = w.cells, w.executions_per_cell, w.tokens_per_s_per_cell
    g = w.group_size
    rollout = sum(x.duration_s) / e
    training = sum(x.tokens) / r
    overhead = w.steps * w.step_overhead_s
    ready = [max(x.duration_s[k * g : k * g + g]) for k in range(w.total_groups)]
    group_tokens = [sum(x.tokens[k * g : k * g + g]) for k in range(w.total_groups)]
    return {
        "work": (rollout + training + overhead) / c,
        "training_window": min(ready) + overhead + training / c,
        "staleness_chain": (
            sum(sorted(ready, reverse=True)[j * w.groups_per_step] for j in range(w.steps)) + overhead
        )
        / (w.max_staleness + 1),
        "last_group": max(
            d + t / (r * c) + w.step_overhead_s for d, t in zip(ready, group_tokens, strict=True)
        ),
    }


def lower_bound_s(w: Workload, x: Executions) -> float:
    return max(lower_bounds(w, x).values())
