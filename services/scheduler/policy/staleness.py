"""The max-staleness bound, enforced by admission and by the order groups enter steps (pure).

Two rules together guarantee that every group is trained at most K versions after it was admitted
(K = max_staleness), never by dropping work and never silently:

1. **Admission cap.** At version v at most (v + K + 1) * B groups may have been admitted in all.
   A group admitted at version v is *due* by step v + K. Every group due by step k was admitted at
   a version <= k - K, so there are at most (k + 1) * B of them: exactly what steps 0..k consume.
2. **Due groups first.** Step k takes ready groups oldest version first, and keeps one place per
   admitted-but-unready group that is due by k, so a due group is never crowded out; if one is
   still running the step waits for it (the cost of the bound, measured as idle training).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def due_unready(view: ClusterView, config: PolicyConfig) -> int:
    """Admitted groups still running that step `view.version` must include (due by it)."""
    step = view.version
    return sum(n for version, n in view.running_groups if version + config.max_staleness <= step)


def groups_for_step(
    *,
    step: int,
    places: int,
    ready: Sequence[ReadyGroup],
    due_running: int,
    max_staleness: int,
    streaming: bool,
) -> tuple[int, ...]:
    """Ready groups that join step `step`, which has `places` places left.

    Streaming takes groups as they become ready; otherwise the step waits until it can take all
    its places at once (one globally shuffled batch). Either way, places are kept for due groups
    that are still running.

    Example (K=1, step 3, 3 places; one group admitted at version 2 is still running):
        ready: g7 (v2, due by 3), g8 (v3), g9 (v3)
        streaming     -> (7, 8): g7 is due; g8 fits in the 2 places left beside the kept one;
                         g9 would take the place kept for the running due group
        not streaming -> (): the step waits for the due group and then takes 3 at once
    """
    if places <= 0:
        return ()
    ordered = sorted(ready, key=lambda g: (g.version, g.group_id))
    if not streaming:
        if due_running > 0 or len(ordered) < places:
            return ()
        return tuple(g.group_id for g in ordered[:places])
    taken: list[int] = []
    for group in ordered:
        left = places - len(taken)
        if left == 0:
            break
        is_due = group.version + max_staleness <= step
        if is_due or left > due_running:
            taken.append(group.group_id)
    return tuple(taken)


def assign_ready(view: ClusterView, config: PolicyConfig, *, streaming: bool) -> tuple[int, ...]:
    """`groups_for_step` for the running step of `view` (none while its update runs)."""
    if view.in_overhead:
        return ()
    return groups_for_step(
        step=view.version,
        places=config.groups_per_step - view.step_groups,
        ready=view.ready,
        due_running=due_unready(view, config),
        max_staleness=config.max_staleness,
        streaming=streaming,
    )


def assigned_tokens(view: ClusterView, group_ids: Sequence[int]) -> int:
    wanted = set(group_ids)
    return sum(g.tokens for g in view.ready if g.group_id in wanted)
