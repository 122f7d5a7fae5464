"""The live routing table: routes, per-engine load, sticky executions (shell state, pure choice).

An engine that broke a call's stream (it died, or its link did) is left out of routing for
`down_s`, or until it registers again; the call goes on elsewhere (`failover`).
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable
from dataclasses import replace

from gyre.errors import Unavailable
from services.proxy.generation import EnginePool
from services.proxy.routing import Load, Route, RouteStateName, choose_engine


class Router:
    def __init__(self, pool: EnginePool, routes: Iterable[Route] = (), *, down_s: float = 30.0) -> None:
        self.pool = pool
        self.routes: dict[str, Route] = {r.engine_id: r for r in routes}
        self.in_flight: dict[str, int] = {}
        self.sticky: dict[str, str] = {}
        self.down_s = down_s
        self.down: dict[str, float] = {}
        """Engines that broke a stream -> until when (monotonic) they get no calls."""

    def loads(self) -> list[Load]:
        return [Load(route=r, num_in_flight=self.in_flight.get(r.engine_id, 0)) for r in self.routes.values()]

    def _serving(self) -> list[Load]:
        now = time.monotonic()
        return [load for load in self.loads() if self.down.get(load.route.engine_id, 0.0) <= now]

    def pick(self, execution_id: str, *, allowed_cells: Collection[str] = ()) -> Route:
        route = choose_engine(
            self._serving(), sticky_engine_id=self.sticky.get(execution_id, ""), allowed_cells=allowed_cells
        )
        if route is None:
            raise Unavailable("no engine is serving: no cell is in the rollout role")
        self.sticky[execution_id] = route.engine_id
        return route

    def pick_target(self, *, exclude_cell: str, allowed_cells: Collection[str]) -> Route | None:
        loads = [load for load in self._serving() if load.route.cell_id != exclude_cell]
        return choose_engine(loads, sticky_engine_id="", allowed_cells=allowed_cells)

    def failover(self, execution_id: str, broken: Route) -> Route | None:
        """Another engine for a call whose stream `broken` broke; that engine rests meanwhile."""
        self.down[broken.engine_id] = time.monotonic() + self.down_s
        loads = [load for load in self._serving() if load.route.engine_id != broken.engine_id]
        route = choose_engine(loads, sticky_engine_id="")
        if route is not None:
            self.sticky[execution_id] = route.engine_id
        return route

    def call_started(self, engine_id: str) -> None:
        self.in_flight[engine_id] = self.in_flight.get(engine_id, 0) + 1

    def call_finished(self, engine_id: str) -> None:
        self.in_flight[engine_id] = max(self.in_flight.get(engine_id, 0) - 1, 0)

    def moved(self, from_engine: str, to_engine: str) -> None:
        self.call_finished(from_engine)
        self.call_started(to_engine)

    def observed_version(self, engine_id: str, version: int) -> None:
        """The policy version an engine's latest token carried (GetRouting reports it)."""
        route = self.routes.get(engine_id)
        if route is not None and route.policy_version != version:
            self.routes[engine_id] = replace(route, policy_version=version)

    def register(self, route: Route) -> None:
        self.routes[route.engine_id] = route
        self.down.pop(route.engine_id, None)  # registered again: serving again

    def set_cell_state(self, cell_id: str, state: RouteStateName) -> None:
        for engine_id, route in list(self.routes.items()):
            if route.cell_id == cell_id:
                self.routes[engine_id] = replace(route, state=state)

    def forget(self, execution_id: str) -> None:
        self.sticky.pop(execution_id, None)
