"""The live routing table: routes, per-engine load, sticky executions (shell state, pure choice)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from gyre.errors import Unavailable
from services.proxy.generation import EnginePool
from services.proxy.routing import Load, Route, RouteStateName, choose_engine


class Router:
    def __init__(self, pool: EnginePool, routes: Iterable[Route] = ()) -> None:
        self.pool = pool
        self.routes: dict[str, Route] = {r.engine_id: r for r in routes}
        self.in_flight: dict[str, int] = {}
        self.sticky: dict[str, str] = {}

    def loads(self) -> list[Load]:
        return [Load(route=r, num_in_flight=self.in_flight.get(r.engine_id, 0)) for r in self.routes.values()]

    def pick(self, execution_id: str, *, allowed_cells: Collection[str] = ()) -> Route:
        route = choose_engine(
            self.loads(), sticky_engine_id=self.sticky.get(execution_id, ""), allowed_cells=allowed_cells
        )
        if route is None:
            raise Unavailable("no engine is serving: no cell is in the rollout role")
        self.sticky[execution_id] = route.engine_id
        return route

    def pick_target(self, *, exclude_cell: str, allowed_cells: Collection[str]) -> Route | None:
        loads = [load for load in self.loads() if load.route.cell_id != exclude_cell]
        return choose_engine(loads, sticky_engine_id="", allowed_cells=allowed_cells)

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

    def set_cell_state(self, cell_id: str, state: RouteStateName) -> None:
        for engine_id, route in list(self.routes.items()):
            if route.cell_id == cell_id:
                self.routes[engine_id] = replace(route, state=state)

    def forget(self, execution_id: str) -> None:
        self.sticky.pop(execution_id, None)
