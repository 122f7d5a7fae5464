"""The live routing table: routes, per-engine load, sticky executions (shell state, pure choice).

An engine that broke a call's stream (it died, or its link did) is left out of routing for
`down_s`, or until it registers again; the call goes on elsewhere (`failover`).

A call of an execution admitted at version v goes only to an engine whose weights are of
version v or newer (`routing.choose_engine`). The router learns an engine's version from the
tokens it streams (each carries the version that sampled it) and, when every serving engine it
knows of looks too old, by asking them (`GetEngineStats`); the call then waits, asking again
every `version_poll_s`, for at most `version_wait_s` (an engine follows `WeightsPublished` a
moment after the trainer's step), and is refused as unavailable after that.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Iterable
from dataclasses import replace

import grpc
import structlog

from gyre.engine.v1 import engine_pb2
from gyre.errors import Unavailable
from services.proxy.generation import EnginePool
from services.proxy.routing import Load, Route, RouteStateName, active, behind, choose_engine

log = structlog.get_logger(__name__)
STATS_TIMEOUT_S = 2.0


class Router:
    def __init__(
        self,
        pool: EnginePool,
        routes: Iterable[Route] = (),
        *,
        down_s: float = 30.0,
        version_wait_s: float = 60.0,
        version_poll_s: float = 0.1,
    ) -> None:
        self.pool = pool
        self.routes: dict[str, Route] = {r.engine_id: r for r in routes}
        self.in_flight: dict[str, int] = {}
        self.sticky: dict[str, str] = {}
        self.down_s = down_s
        self.down: dict[str, float] = {}
        """Engines that broke a stream -> until when (monotonic) they get no calls."""
        self.version_wait_s = version_wait_s
        self.version_poll_s = version_poll_s
        self.num_waiting = 0
        """Calls waiting for an engine with new enough weights."""
        self._asks: dict[str, asyncio.Future[None]] = {}
        self._asked_at: dict[str, float] = {}

    def loads(self) -> list[Load]:
        return [Load(route=r, num_in_flight=self.in_flight.get(r.engine_id, 0)) for r in self.routes.values()]

    def _serving(self) -> list[Load]:
        now = time.monotonic()
        return [load for load in self.loads() if self.down.get(load.route.engine_id, 0.0) <= now]

    async def pick(
        self, execution_id: str, *, min_version: int = 0, allowed_cells: Collection[str] = ()
    ) -> Route:
        """The engine for an execution's next call, waiting while none has weights of `min_version`."""
        deadline = time.monotonic() + self.version_wait_s
        waiting = False
        try:
            for _ in range(1_000_000):  # bounded by the deadline
                serving = active(self._serving(), allowed_cells=allowed_cells)
                if not serving:
                    raise Unavailable("no engine is serving: no cell is in the rollout role")
                await self.refresh(behind(serving, min_version=min_version))
                route = choose_engine(
                    self._serving(),
                    sticky_engine_id=self.sticky.get(execution_id, ""),
                    allowed_cells=allowed_cells,
                    min_version=min_version,
                )
                if route is not None:
                    self.sticky[execution_id] = route.engine_id
                    if waiting:
                        log.info(
                            "call_waited_for_weights",
                            execution_id=execution_id,
                            min_version=min_version,
                            engine_id=route.engine_id,
                            waited_s=round(self.version_wait_s - (deadline - time.monotonic()), 3),
                        )
                    return route
                if time.monotonic() >= deadline:
                    break
                if not waiting:
                    waiting, self.num_waiting = True, self.num_waiting + 1
                    log.info("call_waits_for_weights", execution_id=execution_id, min_version=min_version)
                await asyncio.sleep(self.version_poll_s)
        finally:
            if waiting:
                self.num_waiting -= 1
        newest = max((load.route.policy_version for load in self._serving()), default=0)
        raise Unavailable(
            f"no serving engine holds weights of policy version {min_version} or newer, which this "
            f"execution was admitted at (newest: {newest}, after waiting {self.version_wait_s:g} s); "
            "retry shortly"
        )

    async def pick_target(
        self, *, exclude_cell: str, allowed_cells: Collection[str], min_version: int = 0
    ) -> Route | None:
        """Where a drain moves a call: another serving engine with weights of `min_version` or newer."""
        loads = [load for load in self._serving() if load.route.cell_id != exclude_cell]
        await self.refresh(behind(active(loads, allowed_cells=allowed_cells), min_version=min_version))
        loads = [load for load in self._serving() if load.route.cell_id != exclude_cell]
        return choose_engine(loads, sticky_engine_id="", allowed_cells=allowed_cells, min_version=min_version)

    async def failover(self, execution_id: str, broken: Route, *, min_version: int = 0) -> Route | None:
        """Another engine for a call whose stream `broken` broke; that engine rests meanwhile."""
        self.down[broken.engine_id] = time.monotonic() + self.down_s
        others = [load for load in self._serving() if load.route.engine_id != broken.engine_id]
        await self.refresh(behind(others, min_version=min_version))
        loads = [load for load in self._serving() if load.route.engine_id != broken.engine_id]
        route = choose_engine(loads, sticky_engine_id="", min_version=min_version)
        if route is not None:
            self.sticky[execution_id] = route.engine_id
        return route

    async def refresh(self, routes: Collection[Route]) -> None:
        """Ask engines for the version of their loaded weights (those that do not answer keep theirs).

        Every waiting call asks, so the asks are shared: an engine is asked at most once per
        `version_poll_s`, and callers arriving meanwhile await that one answer."""
        now = time.monotonic()
        asks = []
        for route in routes:
            ask = self._asks.get(route.engine_id)
            if ask is None or (
                ask.done() and now - self._asked_at.get(route.engine_id, 0.0) >= self.version_poll_s
            ):
                ask = asyncio.ensure_future(self._ask(route))
                self._asks[route.engine_id], self._asked_at[route.engine_id] = ask, now
            asks.append(asyncio.shield(ask))  # a caller that goes away does not cancel the others' ask
        if asks:
            await asyncio.gather(*asks)

    async def _ask(self, route: Route) -> None:
        try:
            stats = await self.pool.stub(route.address).GetEngineStats(
                engine_pb2.GetEngineStatsRequest(), timeout=STATS_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            log.info("engine_version_unknown", engine_id=route.engine_id, error=exc.code().name)
            return
        self.observed_version(route.engine_id, int(stats.policy_version.steps))

    def call_started(self, engine_id: str) -> None:
        self.in_flight[engine_id] = self.in_flight.get(engine_id, 0) + 1

    def call_finished(self, engine_id: str) -> None:
        self.in_flight[engine_id] = max(self.in_flight.get(engine_id, 0) - 1, 0)

    def moved(self, from_engine: str, to_engine: str) -> None:
        self.call_finished(from_engine)
        self.call_started(to_engine)

    def observed_version(self, engine_id: str, version: int) -> None:
        """An engine holds weights of `version` or newer (a token it sampled, or its stats, said so);
        GetRouting reports it. Weights only move forward: an older report changes nothing."""
        route = self.routes.get(engine_id)
        if route is not None and version > route.policy_version:
            self.routes[engine_id] = replace(route, policy_version=version)

    def version_unknown(self, engine_id: str) -> None:
        """The engine refused a call as too old for it (it restarted on older weights): ask again."""
        route = self.routes.get(engine_id)
        if route is not None:
            self.routes[engine_id] = replace(route, policy_version=0)

    def register(self, route: Route) -> None:
        self.routes[route.engine_id] = route
        self.down.pop(route.engine_id, None)  # registered again: serving again

    def set_cell_state(self, cell_id: str, state: RouteStateName) -> None:
        for engine_id, route in list(self.routes.items()):
            if route.cell_id == cell_id:
                self.routes[engine_id] = replace(route, state=state)

    def forget(self, execution_id: str) -> None:
        self.sticky.pop(execution_id, None)
