"""Gyre's elastic policy: the core cell always trains, satellites follow the work (pure).

Each decision:
1. **Stream** ready groups into the running step (due groups first, see `staleness`).
2. **Size the rollout pool.** It needs ceil(demand / slots) cells, where demand is the executions
   running plus those the staleness bound lets the queue release now. While training has work
   the pool is further capped at the *balanced split*: the number of rollout cells at which the
   observed rollout cost of a step's B groups and its training cost (plus the update) take
   equally long (`balanced_rollout_cells`). While training has had no work for longer than a
   switch round trip, every satellite may roll out.
   Cells the queue will need at the next update are kept, unless that update is further off
   than a switch in plus a round trip (`next_release_s`): then they train meanwhile.
   **End game** (`in_end_game`): once the queue may release everything left and an execution
   lasts longer than the remaining updates and round trips, the remaining executions are the
   run's critical path: the pool is sized by demand alone, pulling satellites back from
   training if they need them (training, divisible, takes every cell once they end).
3. **Switch.** Surplus rollout cells are drained (their requests migrate to the fullest cells with
   room, `migration.plan_drain`) and join the running step at its next microbatch boundary.
   A shortfall pulls training satellites back to rollout at their next microbatch boundary.
   A one-cell dead band around the real-valued split keeps noisy estimates from flapping cells.
4. **Admit** as many groups as the staleness bound allows and the kept cells' free slots can
   start (`staleness.groups_to_admit`: every free slot gets an execution, at most G - 1 wait).

The same function with `streaming=False` is the ablation's "elastic without streaming", and with
`batch_sync=True` burst mode. (The ablation's "Colocate + standalone rollout cells" is
`colocate.decide` with `standalone_rollout_cells`, not this policy without a core cell.)

Worked example (8 cells, 4 slots, G=4, B=2, K=2; a group costs 16 rollout cell-s and 8 training
cell-s, no overhead): the balanced split is 5.33 rollout cells, so 5 to 6 of the 7 satellites.
    version 0, 7 rolling out, 20 running, g0 ready   -> assign (0,); 7 > 6: drain 1 cell (its
                                                        requests migrate), it joins the step
    queue empty, 4 running on 6 rollout cells, work  -> need 1 cell: drain 5
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from services.scheduler.policy.staleness import (
    admissible_groups,
    assign_ready,
    assigned_tokens,
    groups_to_admit,
)
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class ElasticKnobs:
    streaming: bool = True
    batch_sync: bool = False
    core_cell: bool = True  # one cell holds the optimizer and never leaves training
    # Rollout cells kept while training has work; None: the balanced split.
    standalone_rollout_cells: int | None = None
    # Once the queue may release everything left, size the rollout pool by demand alone.
    end_game: bool = True


GYRE = ElasticKnobs()


# The estimates it takes change only when a group finishes, and the policy asks after every event.
@functools.lru_cache(maxsize=1024)
def balanced_rollout_cells(
    *, num_cells: int, groups_per_step: int, rollout_cell_s: float, training_cell_s: float, overhead_s: float
) -> float:
    """Real-valued number of rollout cells r at which rollout and training keep pace.

    With n = num_cells - r training cells, B groups take B*a/r seconds to roll out and
    overhead + B*b/n to train (a, b: cell-seconds per group). Solves B*a/r = overhead + B*b/n by
    bisection on r in [1, num_cells - 1].

    Example: 8 cells, B=2, a=16, b=8, overhead 0 -> 32/r = 16/(8-r) -> r = 5.33
    """
    lo, hi = 1.0, float(num_cells - 1)

    def gap(r: float) -> float:  # decreasing in r: rollout gets faster, training slower
        return groups_per_step * rollout_cell_s / r - (
            overhead_s + groups_per_step * training_cell_s / (num_cells - r)
        )

    if gap(hi) >= 0:
        return hi
    if gap(lo) <= 0:
        return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        if gap(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def next_release_s(view: ClusterView, config: PolicyConfig) -> float:
    """A low estimate of the time until the next update releases B more groups: the running
    step's untrained tokens and its missing groups (at the observed cost) on the training cells,
    then the update. 0 when unknown, so a cell is kept for the release.

    Example: 1,000 tokens/s per cell, 5 training cells, 9,400,000 untrained tokens, every group
    of the step assigned, 120 s update -> 9,400,000 / 1,000 / 5 + 120 = 2,000 s.
    """
    if config.tokens_per_s_per_cell is None or view.in_overhead:
        return 0.0
    groups_left = config.groups_per_step - view.step_groups
    cell_s = view.step_untrained_tokens / config.tokens_per_s_per_cell
    cell_s += groups_left * (view.training_cell_s_per_group or 0.0)
    return cell_s / max(1, view.training_cells) + config.step_overhead_s


def in_end_game(view: ClusterView, config: PolicyConfig, *, admissible: int) -> bool:
    """The queue may release everything left, and an execution lasts longer than the updates
    and switch round trips of the steps left: then the remaining executions are the run's
    critical path (no later rollout needs pacing with training, and training, divisible, takes
    every cell once they end), so every satellite they can use should roll out. With short
    executions, pulling cells out of training costs more than starting executions sooner saves.

    Example: mean execution 2,700 s, 3 steps left, 120 s updates, 12 s round trip ->
    2,700 > 3 * 132: end game. Mean execution 32 s, 10 s updates: 32 < 3 * 22: not.
    """
    if view.queued_groups > admissible or view.rollout_cell_s_per_group is None:
        return False
    mean_s = view.rollout_cell_s_per_group * config.slots_per_cell / config.group_size
    steps_left = config.total_groups // config.groups_per_step - view.version
    return mean_s > steps_left * (config.step_overhead_s + config.round_trip_s)


def decide(view: ClusterView, config: PolicyConfig, knobs: ElasticKnobs = GYRE) -> Decision:
    assign = assign_ready(view, config, streaming=knobs.streaming)
    has_work = view.step_untrained_tokens + assigned_tokens(view, assign) > 0
    wants_cells = has_work or (view.in_overhead and bool(view.ready))
    starved = (
        not has_work
        and not view.in_overhead
        and view.training_starved_since_s is not None
        and view.now_s - view.training_starved_since_s >= config.round_trip_s
    )
    slots = config.slots_per_cell
    admissible = admissible_groups(view, config, batch_sync=knobs.batch_sync)
    in_pool = view.running + view.waiting
    need = math.ceil((in_pool + admissible * config.group_size) / slots)
    # The next update lets the queue release B more groups; a cell freed now only to be called back
    # then would pay a round trip and migrate its requests for nothing. Unless that release is far
    # enough off that the cell, once switched in, trains for longer than its round trip costs.
    soon = admissible if knobs.batch_sync else min(view.queued_groups, admissible + config.groups_per_step)
    if next_release_s(view, config) > config.round_trip_s + config.rollout_to_training_s:
        soon = admissible
    need_soon = math.ceil((in_pool + soon * config.group_size) / slots)
    most = config.num_cells - (1 if knobs.core_cell else 0)
    low, high = float(most), float(most)
    if not starved:
        if knobs.standalone_rollout_cells is not None:
            low = high = float(knobs.standalone_rollout_cells)
        elif view.rollout_cell_s_per_group is not None and view.training_cell_s_per_group is not None:
            split = balanced_rollout_cells(
                num_cells=config.num_cells,
                groups_per_step=config.groups_per_step,
                rollout_cell_s=view.rollout_cell_s_per_group,
                training_cell_s=view.training_cell_s_per_group,
                overhead_s=config.step_overhead_s,
            )
            low, high = math.floor(split), math.ceil(split)
    if knobs.end_game and in_end_game(view, config, admissible=admissible):
        low = high = float(most)
    # A pool that cannot hold one group never admits again: with nothing running, no event
    # would ever wake the policy to grow it (small cells, large groups).
    one_group = math.ceil(config.group_size / slots) if admissible else 0
    keep_at_most = max(min(need_soon, int(high)), one_group)
    keep_at_least = max(min(need, int(low)), one_group)
    current = view.rollout_cells + view.switching_to_rollout
    to_training = to_rollout = 0
    if current > keep_at_most and wants_cells:
        to_training = min(current - keep_at_most, view.rollout_cells)
    elif current < keep_at_least:
        satellites = view.training_cells - (1 if knobs.core_cell else 0)
        to_rollout = max(0, min(keep_at_least - current, satellites))
    admit = groups_to_admit(
        admissible=admissible,
        free_slots=(view.rollout_cells - to_training) * slots - view.running,
        waiting=view.waiting,
        group_size=config.group_size,
    )
    return Decision(assign=assign, admit=admit, to_training=to_training, to_rollout=to_rollout)
