"""Choose the engine for a call: rollout cells only, sticky per execution, least-loaded else (pure).

Sticky routing keeps an execution on the engine that already holds its prefix in the KV cache;
an execution whose engine stopped serving (drained, gone) moves to the least-loaded active one.

Example:
    routes: a (active, 3 in flight), b (active, 1), c (draining, 0)
    choose_engine(routes, sticky="a")  -> a   (sticky wins while a serves)
    choose_engine(routes, sticky="c")  -> b   (c no longer takes calls; b is least loaded)
    choose_engine(routes, sticky="")   -> b
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


def choose_engine(
    loads: Iterable[Load], *, sticky_engine_id: str, allowed_cells: Collection[str] = ()
) -> Route | None:
    """The engine for the next call, or None when no rollout engine serves."""
    candidates = [
        load
        for load in loads
        if load.route.state == "active" and (not allowed_cells or load.route.cell_id in allowed_cells)
    ]
    for load in candidates:
        if load.route.engine_id == sticky_engine_id:
            return load.route
    if not candidates:
        return None
    return min(candidates, key=lambda load: (load.num_in_flight, load.route.engine_id)).route
