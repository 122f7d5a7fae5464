"""`staleness.groups_for_step` counts the groups it takes per version; it must take exactly the
groups the one-group-at-a-time earliest-deadline rule (kept here as the reference) takes."""

from __future__ import annotations

import random
from collections.abc import Sequence

from services.scheduler.policy.staleness import groups_for_step
from services.scheduler.policy.state import ReadyGroup


def reference(
    *,
    step: int,
    places: int,
    ready: Sequence[ReadyGroup],
    running: Sequence[tuple[int, int]],
    max_staleness: int,
    groups_per_step: int,
    streaming: bool,
) -> tuple[int, ...]:
    """The rule as first written: each group in (version, id) order, checked one by one."""
    if places <= 0:
        return ()
    ordered = sorted(ready, key=lambda g: (g.version, g.group_id))
    horizon = range(step, step + max_staleness + 1)
    due_counts: dict[int, int] = {}
    for version, n in [(g.version, 1) for g in ordered] + list(running):
        due_counts[version + max_staleness] = due_counts.get(version + max_staleness, 0) + n
    demand = {j: sum(n for d, n in due_counts.items() if d <= j) for j in horizon}
    capacity = {j: places + (j - step) * groups_per_step for j in horizon}
    taken: list[int] = []
    for group in ordered:
        if len(taken) == places:
            break
        due = group.version + max_staleness
        if all(demand[j] <= capacity[j] - 1 for j in horizon if j < due):
            taken.append(group.group_id)
            for j in horizon:
                capacity[j] -= 1
                if j >= due:
                    demand[j] -= 1
    if not streaming and len(taken) < places:
        return ()
    return tuple(taken)


def test_docstring_example() -> None:
    ready = [
        ReadyGroup(group_id=7, version=2, tokens=1),
        ReadyGroup(group_id=8, version=3, tokens=1),
        ReadyGroup(group_id=9, version=3, tokens=1),
    ]
    args = {
        "step": 3,
        "places": 3,
        "ready": ready,
        "running": [(2, 1)],
        "max_staleness": 1,
        "groups_per_step": 3,
    }
    assert groups_for_step(**args, streaming=True) == (7, 8)
    assert groups_for_step(**args, streaming=False) == ()


def test_same_groups_as_one_at_a_time_on_random_cases() -> None:
    rng = random.Random(25)
    taken_some = 0
    for _ in range(4000):
        k = rng.randint(0, 3)
        b = rng.randint(1, 6)
        step = rng.randint(0, 5)
        # Versions a live run can hold at `step` (admitted no earlier than step - K), plus a few
        # outside that window, which the rule must handle the same way.
        versions = range(max(0, step - k - 1), step + k + 2)
        ids = rng.sample(range(100), rng.randint(0, 12))
        ready = [ReadyGroup(group_id=i, version=rng.choice(versions), tokens=1) for i in ids]
        running = sorted(
            {
                v: rng.randint(1, 4)
                for v in rng.sample(list(versions), rng.randint(0, min(3, len(versions))))
            }.items()
        )
        args = {
            "step": step,
            "places": rng.randint(-1, b),
            "ready": ready,
            "running": running,
            "max_staleness": k,
            "groups_per_step": b,
            "streaming": rng.random() < 0.5,
        }
        expected = reference(**args)  # type: ignore[arg-type]
        assert groups_for_step(**args) == expected, args  # type: ignore[arg-type]
        taken_some += bool(expected)
    assert taken_some > 1000  # the cases exercise taking, not only the early answers
