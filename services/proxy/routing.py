"""Choose the engine for a call: rollout cells only, sticky per execution, least-loaded else (pure).

Sticky routing keeps an execution on the engine that already holds its prefix in the KV cache;
an execution whose engine stopped serving (drained, gone) moves to the least-loaded active one.
A call may need weights of a version or newer (`min_version`: its execution's admitted version,
so staleness stays within the scheduler's bound for every token); an engine known to hold older
ones is passed over, even when sticky. `policy_version` is what the proxy last learnt of the
engine: weights only move forward, so a known version is never above the engine's own.

Example:
    routes: a (active, 3 in flight, v2), b (active, 1, v1), c (draining, 0, v2)
    choose_engine(routes, sticky="a")                -> a   (sticky wins while a serves)
    choose_engine(routes, sticky="c")                -> b   (c no longer takes calls; b least loaded)
    choose_engine(routes, sticky="")                 -> b
    choose_engine(routes, sticky="b", min_version=2) -> a   (b's weights are too old)
    behind(routes, min_version=2)                    -> [b] (ask b for its version before waiting)
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Literal

RouteStateName = Literal["active", "draining", "drained"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    cell_id: str
    engine_id: str
    address: str
    state: RouteStateName = "active"
    policy_version: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Load:
    """A route with the number of calls generating on it now."""

    route: Route
    num_in_flight: int


def active(loads: Iterable[Load], *, allowed_cells: Collection[str] = ()) -> list[Load]:
    """The loads of engines that take new calls (within `allowed_cells`, when given)."""
    return [
        load
        for load in loads
        if load.route.state == "active" and (not allowed_cells or load.route.cell_id in allowed_cells)
    ]


def behind(loads: Iterable[Load], *, min_version: int) -> list[Route]:
    """Active engines known to hold weights older than `min_version` (their version may be stale)."""
    return [load.route for load in active(loads) if load.route.policy_version < min_version]


def choose_engine(
    loads: Iterable[Load],
    *,
    sticky_engine_id: str,
    allowed_cells: Collection[str] = (),
    min_version: int = 0,
) -> Route | None:
    """The engine for the next call, or None when no rollout engine with new enough weights serves."""
    candidates = [
        load
        for load in active(loads, allowed_cells=allowed_cells)
        if load.route.policy_version >= min_version
    ]
    for load in candidates:
        if load.route.engine_id == sticky_engine_id:
            return load.route
    if not candidates:
        return None
    return min(candidates, key=lambda load: (load.num_in_flight, load.route.engine_id)).route
