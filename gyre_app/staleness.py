"""Explaining staleness: which policy versions produced which tokens, and where time went (pure).

Staleness of a sample (DESIGN section 3) is the trainer's version when it consumed the sample
minus the oldest version that produced any of its target tokens. A sample is stale when that is
above 0; explaining it means naming the versions behind its tokens and the stage of its
execution's life that took longest between admission and consumption.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionRun:
    """Target tokens `first`..`last` (positions in the sample, inclusive) all made by `version`."""

    version: int
    first: int
    last: int
    num_tokens: int


def version_runs(policy_versions: Sequence[int], loss_mask: Sequence[bool]) -> list[VersionRun]:
    """Consecutive target tokens of one version, in token order; context positions are skipped.

    Example:
        versions (0, 3, 3, 0, 4, 4), mask (F, T, T, F, T, T)
        -> [VersionRun(3, first=1, last=2, n=2), VersionRun(4, first=4, last=5, n=2)]
    """
    runs: list[VersionRun] = []
    for t, (v, m) in enumerate(zip(policy_versions, loss_mask, strict=True)):
        if not m:
            continue
        if runs and runs[-1].version == v:
            r = runs[-1]
            runs[-1] = VersionRun(version=v, first=r.first, last=t, num_tokens=r.num_tokens + 1)
        else:
            runs.append(VersionRun(version=v, first=t, last=t, num_tokens=1))
    return runs


def distribution(staleness: Iterable[int]) -> dict[int, int]:
    """Samples per staleness value, smallest first. Example: (0, 2, 0, 1) -> {0: 2, 1: 1, 2: 1}."""
    return dict(sorted(Counter(staleness).items()))


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """When one execution passed each stage; None where the owning service did not say."""

    admitted_at: datetime | None
    started_at: datetime | None
    ended_at: datetime | None
    group_ended_at: datetime | None
    """When the last execution of its group ended (a group trains only once all have)."""
    consumed_at: datetime | None


POINTS = (
    ("admitted_at", ""),
    ("started_at", "a rollout slot"),
    ("ended_at", "its own rollout"),
    ("group_ended_at", "the rest of its group"),
    ("consumed_at", "the trainer (rewards, queue, earlier steps)"),
)
"""The stages in order, each named by what the time before it was spent waiting for."""


def waits(timeline: Timeline) -> list[tuple[str, float]]:
    """Seconds between consecutive known points, named by what was waited for; a stage whose start
    is unknown is merged into the next known one.

    Example:
        admitted 0 s, started 2 s, ended 50 s, group ended 80 s, consumed 81 s
        -> [("a rollout slot", 2), ("its own rollout", 48), ("the rest of its group", 30),
            ("the trainer (rewards, queue, earlier steps)", 1)]
        admitted 0 s, consumed 81 s, the rest unknown
        -> [("a rollout slot + its own rollout + the rest of its group + the trainer (...)", 81)]
    """
    out: list[tuple[str, float]] = []
    since: datetime | None = None
    pending: list[str] = []
    for attr, waited_for in POINTS:
        at = getattr(timeline, attr)
        if waited_for:
            pending.append(waited_for)
        if at is None:
            continue
        if since is not None:
            out.append((" + ".join(pending), max(0.0, (at - since).total_seconds())))
        since, pending = at, []
    return out


def waited_most_for(timeline: Timeline) -> str | None:
    known = waits(timeline)
    return max(known, key=lambda w: w[1])[0] if known else None
