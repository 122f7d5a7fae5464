"""The max-staleness bound, enforced by admission and by the order groups enter steps (pure).

Two rules together guarantee that every group is trained at most K versions after it was admitted
(K = max_staleness), never by dropping work and never silently:

1. **Admission cap.** At version v at most (v + K + 1) * B groups may have been admitted in all.
   A group admitted at version v is *due* by step v + K. Every group due by step k was admitted at
   a version <= k - K, so there are at most (k + 1) * B of them: exactly what steps 0..k consume.
2. **Earliest deadline first, never overbooked.** Step k takes ready groups oldest version first,
   and takes a group due later only if every group due by each earlier step still fits in the
   places left (`groups_for_step`); a due group still running makes its step wait (the cost of
   the bound, measured as idle training). With rule 1 this is always feasible.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Sequence
from operator import attrgetter

from services.scheduler.policy.state import ClusterView, PolicyConfig, ReadyGroup


def admission_cap(*, version: int, admitted: int, max_staleness: int, groups_per_step: int) -> int:
    """How many more groups may be admitted at `version` without breaking the bound.

    Example:
        B=16, K=2, version 0, 40 admitted -> (0 + 2 + 1) * 16 - 40 = 8
        version 1 -> 64 - 40 = 24
    """
    return max(0, (version + max_staleness + 1) * groups_per_step - admitted)


def admissible_groups(view: ClusterView, config: PolicyConfig, *, batch_sync: bool) -> int:
    """Groups the queue may release now (before counting free slots).

    With `batch_sync` groups are released one batch of B at a time and the next batch only once
    every admitted group has finished (vanilla one-step-off Async, burst mode).

    Example:
        B=4, K=1, version 0, 6 admitted, queue 100 -> cap (0+1+1)*4 - 6 = 2
        batch_sync: 6 % 4 = 2 into the batch -> min(2, 4 - 2) = 2
        batch_sync, 8 admitted, 1 group still running -> 0 (wait for the batch to finish)
    """
    cap = admission_cap(
        version=view.version,
        admitted=view.groups_admitted,
        max_staleness=config.max_staleness,
        groups_per_step=config.groups_per_step,
    )
    n = min(cap, view.queued_groups)
    if batch_sync:
        into_batch = view.groups_admitted % config.groups_per_step
        if into_batch == 0 and view.running_groups:
            return 0
        n = min(n, config.groups_per_step - into_batch)
    return max(0, n)


def groups_to_admit(*, admissible: int, free_slots: int, waiting: int, group_size: int) -> int:
    """How many of the `admissible` groups to admit into `free_slots`.

    A group's executions start one by one as slots free up (its staleness counts from its
    admission, the oldest version any of its tokens can come from), so a free slot never idles
    while the queue may release work: admit until every free slot has an execution to take it.
    At most G - 1 executions then wait, and only briefly.

    Example (G=4): 6 free slots, none waiting -> 2 groups (4 start now, 2 as soon as slots free)
                   6 free slots, 3 waiting    -> 1 group; 0 free slots -> 0
    """
    room = free_slots - waiting
    return min(admissible, max(0, -(-room // group_size)))


def groups_for_step(
    *,
    step: int,
    places: int,
    ready: Sequence[ReadyGroup],
    running: Sequence[tuple[int, int]],
    max_staleness: int,
    groups_per_step: int,
    streaming: bool,
) -> tuple[int, ...]:
    """Ready groups that join step `step`, which has `places` places left.

    Earliest deadline first, with a feasibility check: a group due later than this step is taken
    only if, for every step j before its deadline, the groups due by j (ready or still running)
    still fit in the places of steps `step`..j. So no group is ever crowded past its deadline, and
    a step waits for a due group that is still running. Streaming takes groups as they become
    ready; otherwise the step takes all its places at once (one globally shuffled batch) or none.

    Example (K=1, B=3, step 3 with 3 places; one group admitted at version 2 is still running):
        ready: g7 (v2, due by 3), g8 (v3), g9 (v3)
        streaming     -> (7, 8): g7 is due; g8 fits in the 2 places left beside the kept one;
                         g9 would take the place kept for the running due group
        not streaming -> (): the step waits for the due group and then takes 3 at once

    The groups taken are always a prefix of the ready ones in (version, id) order: taking a group
    leaves every later deadline's slack as it was and lowers the earlier ones', and a group that
    does not fit fails a check that every later group (due no earlier) makes too. So the prefix
    is counted one version at a time, and the ids are sorted only when some are taken: the
    simulator asks after every event, with hundreds of groups ready at 1,024 cells.
    """
    # At most every ready group is taken: these answers need no counting.
    if places <= 0 or not ready or (not streaming and len(ready) < places):
        return ()
    ready_by_version = Counter(map(attrgetter("version"), ready))
    horizon = range(step, step + max_staleness + 1)
    due_counts: dict[int, int] = {}
    for version, n in [*ready_by_version.items(), *running]:
        due_counts[version + max_staleness] = due_counts.get(version + max_staleness, 0) + n
    demand = {j: sum(n for d, n in due_counts.items() if d <= j) for j in horizon}
    capacity = {j: places + (j - step) * groups_per_step for j in horizon}
    take = 0
    for version in sorted(ready_by_version):
        due = version + max_staleness
        count = ready_by_version[version]
        # The i-th group of this version fits while i < capacity[j] - demand[j] for every step j
        # before its deadline (each one taken lowers capacity, not demand, there).
        fit = max(0, min([count, places - take] + [capacity[j] - demand[j] for j in horizon if j < due]))
        take += fit
        for j in horizon:
            capacity[j] -= fit
            if j >= due:
                demand[j] -= fit
        if fit < count:
            break  # places are gone, or a check failed that every later group makes too
    if take == 0 or (not streaming and take < places):
        return ()
    return tuple(g.group_id for g in heapq.nsmallest(take, ready, key=lambda g: (g.version, g.group_id)))


def assign_ready(view: ClusterView, config: PolicyConfig, *, streaming: bool) -> tuple[int, ...]:
    """`groups_for_step` for the running step of `view` (none while its update runs)."""
    if view.in_overhead:
        return ()
    return groups_for_step(
        step=view.version,
        places=config.groups_per_step - view.step_groups,
        ready=view.ready,
        running=view.running_groups,
        max_staleness=config.max_staleness,
        groups_per_step=config.groups_per_step,
        streaming=streaming,
    )


def assigned_tokens(view: ClusterView, group_ids: Sequence[int]) -> int:
    wanted = set(group_ids)
    return sum(g.tokens for g in view.ready if g.group_id in wanted)
