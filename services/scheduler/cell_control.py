"""Cells and modes: RegisterCell, SendHeartbeat, GetCells, SetMode, SwitchCell, loss by silence (shell).

Roles live in `scheduler.cells` and every change goes out as an event through the outbox, in the
transaction that records it. A switch marks the cell `switching` first (so a second switch of
the same cell is refused), runs its phases through `switching.Switcher` outside any transaction,
then records the role it ended in with its `CellRoleChanged`. A scheduler that restarts finds a
cell still marked `switching` and declares it lost (`settle_interrupted`): its agent's next
heartbeat learns so and registers again, which puts it back in a role it can hold.
"""

from __future__ import annotations

import asyncio
import statistics
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import grpc
import structlog
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from gyre.events import new_event
from gyre.ids import new_uuid7
from gyre.scheduler.v1 import events_pb2, scheduler_pb2
from services.scheduler import repo
from services.scheduler.cells import (
    CellRecord,
    Mode,
    check_switch,
    parse_mode,
    registered,
    silent_cells,
    validate_registration,
)
from services.scheduler.codec import (
    MODE_FROM_PROTO,
    MODE_TO_PROTO,
    ROLE_FROM_PROTO,
    cell_to_proto,
    registration_from_proto,
)
from services.scheduler.switching import Switcher

log = structlog.get_logger(__name__)
PRODUCER = "scheduler"
M = TypeVar("M", bound=Message)


class CellControl:
    """The cell-facing half of SchedulerService (mixed into the servicer) and the switch runner."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        switcher: Switcher | None,
        *,
        default_mode: Mode,
        lost_after_s: float,
        admission: str = "paced",
        runner_address: str = "",
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.switcher = switcher
        self.default_mode = default_mode
        self.lost_after_s = lost_after_s
        self.admission = admission
        self.runner_address = runner_address
        self.switching: set[str] = set()
        self.switch_s: dict[str, deque[float]] = {"training": deque(maxlen=16), "rollout": deque(maxlen=16)}
        """Durations of recent completed switches, by target role: the policy's cost estimates."""
        self.on_change: Callable[[], None] = lambda: None
        """Called after anything the driver decides from changed (set by the wiring)."""

    # -- exactly once -------------------------------------------------------------------------

    async def _answered(self, method: str, request: Message, cls: type[M]) -> M | None:
        return await repo.requests.answered(self.sessions, method=method, request=request, cls=cls)

    async def _publish(self, session: AsyncSession, *payloads: Message, cause: str) -> None:
        events = [new_event(p, producer=PRODUCER, correlation_id=cause, causation_id=cause) for p in payloads]
        await enqueue(session, repo.outbox, *events)

    async def _idempotent(
        self,
        method: str,
        request: Message,
        cls: type[M],
        act: Callable[[AsyncSession], Awaitable[tuple[M, list[Message]]]],
    ) -> M:
        """`act` once per request id (`gyre.db.requests`); its events commit with its answer."""

        async def run(session: AsyncSession) -> M:
            answer, events = await act(session)
            await self._publish(session, *events, cause=getattr(request, "request_id"))  # noqa: B009
            return answer

        answer, fresh = await repo.requests.answer_once(
            self.sessions, method=method, request=request, cls=cls, act=run
        )
        if fresh:
            self.relay.poke()
            self.on_change()
        return answer

    # -- RPCs ---------------------------------------------------------------------------------

    async def RegisterCell(
        self, request: scheduler_pb2.RegisterCellRequest, context: object
    ) -> scheduler_pb2.RegisterCellResponse:
        reg = registration_from_proto(request)

        async def act(session: AsyncSession) -> tuple[scheduler_pb2.RegisterCellResponse, list[Message]]:
            _, fingerprint = await repo.load_cluster(session, default_mode=self.default_mode, for_update=True)
            cells = [c for c, _ in await repo.load_cells(session, for_update=True)]
            if reg.cell_id in self.switching:
                raise Conflict(f"cell_id: {reg.cell_id} is switching; register again once the switch ended")
            validate_registration(reg, cells=cells, cluster_fingerprint=fingerprint)
            known = next((c for c in cells if c.cell_id == reg.cell_id), None)
            cell = registered(reg, known=known)
            now = datetime.now(UTC)
            await repo.save_cell(session, cell, now=now, registered=True)
            if not fingerprint and reg.model_fingerprint and not reg.core:
                await repo.save_cluster(session, fingerprint=reg.model_fingerprint)
            msg = cell_to_proto(cell, last_heartbeat_at=now)
            return scheduler_pb2.RegisterCellResponse(cell=msg), [events_pb2.CellRegistered(cell=msg)]

        answer = await self._idempotent("RegisterCell", request, scheduler_pb2.RegisterCellResponse, act)
        cell = await self._cell(request.cell_id)
        if cell.role == "rollout":  # routed by the scheduler, per cell: nothing else registers engines
            await self._serve(cell, request_id=f"{request.request_id}:serve")
        log.info("cell_registered", cell_id=request.cell_id, core=request.core, role=cell.role)
        return answer

    async def SendHeartbeat(
        self, request: scheduler_pb2.SendHeartbeatRequest, context: object
    ) -> scheduler_pb2.SendHeartbeatResponse:
        async with self.sessions() as session, session.begin():
            role = await repo.touch_cell(session, request.cell_id, now=datetime.now(UTC))
        if role is None:
            raise NotFound(f"cell_id: no cell {request.cell_id!r} is registered")
        return scheduler_pb2.SendHeartbeatResponse(
            role=scheduler_pb2.CellRole.Value(f"CELL_ROLE_{role.upper()}")
        )

    async def GetCells(
        self, request: scheduler_pb2.GetCellsRequest, context: object
    ) -> scheduler_pb2.GetCellsResponse:
        async with self.sessions() as session, session.begin():
            mode, _ = await repo.load_cluster(session, default_mode=self.default_mode)
            cells = await repo.load_cells(session)
        return scheduler_pb2.GetCellsResponse(
            cells=[cell_to_proto(c, last_heartbeat_at=at) for c, at in cells], mode=MODE_TO_PROTO[mode]
        )

    async def SetMode(
        self, request: scheduler_pb2.SetModeRequest, context: object
    ) -> scheduler_pb2.SetModeResponse:
        if request.mode not in MODE_FROM_PROTO:
            raise InvalidArgument("mode", f"must be COLOCATE, ASYNC, GYRE or BURST, got {request.mode}")
        mode = parse_mode(MODE_FROM_PROTO[request.mode])

        async def act(session: AsyncSession) -> tuple[scheduler_pb2.SetModeResponse, list[Message]]:
            previous, _ = await repo.load_cluster(session, default_mode=self.default_mode, for_update=True)
            answer = scheduler_pb2.SetModeResponse(previous_mode=MODE_TO_PROTO[previous], mode=request.mode)
            if mode != previous and await repo.step_in_progress(session):
                # Strictly between steps: the driver applies it once the running step completed.
                await repo.save_pending_mode(session, mode, request_id=request.request_id)
                return answer, []
            await repo.save_cluster(session, mode=mode)
            await repo.save_pending_mode(session, None)
            return answer, [_mode_changed(previous, mode, request.request_id)]

        answer = await self._idempotent("SetMode", request, scheduler_pb2.SetModeResponse, act)
        log.info("mode_set", mode=mode)
        return answer

    async def apply_pending_mode(self, session: AsyncSession) -> str | None:
        """Between steps: the mode a SetMode asked for during the last one takes effect now (its
        ModeChanged goes out in this transaction); returns it, None when none was waiting."""
        mode, request_id = await repo.pending_mode(session)
        if mode is None or await repo.step_in_progress(session):
            return None
        previous, _ = await repo.load_cluster(session, default_mode=self.default_mode, for_update=True)
        await repo.save_cluster(session, mode=mode)
        await repo.save_pending_mode(session, None)
        await self._publish(session, _mode_changed(previous, mode, request_id), cause=request_id)
        log.info("mode_applied_between_steps", previous=previous, mode=mode)
        return mode

    async def SwitchCell(
        self, request: scheduler_pb2.SwitchCellRequest, context: object
    ) -> scheduler_pb2.SwitchCellResponse:
        first = await self._answered("SwitchCell", request, scheduler_pb2.SwitchCellResponse)
        if first is not None:
            return first
        role = ROLE_FROM_PROTO.get(request.role, str(request.role))
        async with self.sessions() as session:
            cells = {c.cell_id: c for c, _ in await repo.load_cells(session)}
        cell = check_switch(cells.get(request.cell_id), cell_id=request.cell_id, role=role)
        switch = await self.switch(
            cell, to=role, request_id=request.request_id, cause=f"request:{request.request_id}"
        )
        answer = scheduler_pb2.SwitchCellResponse(switch=switch)

        async def act(session: AsyncSession) -> tuple[scheduler_pb2.SwitchCellResponse, list[Message]]:
            return answer, []

        return await self._idempotent("SwitchCell", request, scheduler_pb2.SwitchCellResponse, act)

    # -- switching ------------------------------------------------------------------------------

    async def _cell(self, cell_id: str) -> CellRecord:
        async with self.sessions() as session:
            cells = {c.cell_id: c for c, _ in await repo.load_cells(session)}
        if cell_id not in cells:
            raise NotFound(f"cell_id: no cell {cell_id!r} is registered")
        return cells[cell_id]

    async def _core(self) -> CellRecord:
        async with self.sessions() as session:
            core = next((c for c, _ in await repo.load_cells(session) if c.core), None)
        if core is None or core.role == "lost":
            raise Unavailable("no core cell is registered: the trainer's cell must register first")
        return core

    async def _unroute(self, cell: CellRecord) -> None:
        """A lost rollout cell gets no new calls: the proxy drains it (what it cannot move stays
        with the silent engine, whose calls fail there). Registering again routes it anew."""
        assert self.switcher is not None
        try:
            await self.switcher.unroute(cell, request_id=f"lost-{new_uuid7()}")
        except grpc.aio.AioRpcError as exc:
            log.warning("lost_cell_unroute_failed", cell_id=cell.cell_id, error=exc.code().name)

    async def _serve(self, cell: CellRecord, *, request_id: str) -> None:
        if self.switcher is None:
            return
        await self.switcher.route(cell, request_id=request_id)

    async def switch(
        self, cell: CellRecord, *, to: str, request_id: str, cause: str
    ) -> scheduler_pb2.CellSwitch:
        """Run one switch to its end; the cell's role and the CellRoleChanged event commit together."""
        if self.switcher is None:
            raise Unavailable(
                "the scheduler has no proxy address (GYRE_SCHEDULER_PROXY_ADDRESS): it cannot switch cells"
            )
        if cell.cell_id in self.switching:
            raise Conflict(f"cell_id: {cell.cell_id} is already switching")
        core = await self._core()
        self.switching.add(cell.cell_id)
        try:
            async with self.sessions() as session, session.begin():
                await repo.set_role(session, cell.cell_id, role="switching", target_role=to)
            if to == "training":
                sw = await self.switcher.to_training(cell, core=core, request_id=request_id)
            else:
                sw = await self.switcher.to_rollout(cell, core=core, request_id=request_id)
            ended = ROLE_FROM_PROTO[sw.to_role]
            if sw.ok:
                self.switch_s[to].append(sw.total_s)
            async with self.sessions() as session, session.begin():
                await repo.set_role(session, cell.cell_id, role=ended)
                await self._publish(
                    session, events_pb2.CellRoleChanged(switch=sw, cause=cause), cause=request_id
                )
        finally:
            self.switching.discard(cell.cell_id)
        self.relay.poke()
        self.on_change()
        log.info(
            "cell_role_changed",
            cell_id=cell.cell_id,
            to=ended,
            ok=sw.ok,
            total_s=round(sw.total_s, 3),
            error=sw.error or None,
        )
        return sw

    def measured_switch_s(self, to: str, *, default: float) -> float:
        """Median of the recent switches towards `to`; `default` before the first."""
        recent = self.switch_s[to]
        return statistics.median(recent) if recent else default

    async def settle_interrupted(self) -> None:
        """After a restart: a cell left `switching` is lost (its phases' effects are unknown); its
        agent registers again, and registration routes it afresh."""
        async with self.sessions() as session, session.begin():
            for cell, _ in await repo.load_cells(session, for_update=True):
                if cell.role == "switching" and cell.cell_id not in self.switching:  # not this process's
                    await repo.set_role(session, cell.cell_id, role="lost")
                    await self._publish(
                        session,
                        events_pb2.CellLost(
                            cell_id=cell.cell_id, last_role=scheduler_pb2.CELL_ROLE_SWITCHING
                        ),
                        cause="restart",
                    )
        self.relay.poke()

    async def watch_heartbeats(self, stop: asyncio.Event) -> None:
        """Declare cells lost once silent for `lost_after_s`; their agents must register again."""
        await self.settle_interrupted()
        while not stop.is_set():
            now = datetime.now(UTC)
            lost: list[CellRecord] = []
            async with self.sessions() as session, session.begin():
                rows = await repo.load_cells(session, for_update=True)
                beats = [(c, at.timestamp()) for c, at in rows if c.cell_id not in self.switching]
                for cell, silent_s in silent_cells(
                    beats, now_s=now.timestamp(), lost_after_s=self.lost_after_s
                ):
                    await repo.set_role(session, cell.cell_id, role="lost")
                    await self._publish(
                        session,
                        events_pb2.CellLost(
                            cell_id=cell.cell_id,
                            last_role=scheduler_pb2.CellRole.Value(f"CELL_ROLE_{cell.role.upper()}"),
                            silent_s=silent_s,
                        ),
                        cause=f"lost:{cell.cell_id}",
                    )
                    log.warning(
                        "cell_lost", cell_id=cell.cell_id, role=cell.role, silent_s=round(silent_s, 1)
                    )
                    lost.append(cell)
                    self.on_change()
            self.relay.poke()
            for cell in lost:
                if cell.role == "rollout" and self.switcher is not None:
                    await self._unroute(cell)
            try:
                await asyncio.wait_for(stop.wait(), timeout=min(1.0, self.lost_after_s / 4))
            except TimeoutError:
                pass


def _mode_changed(previous: str, mode: str, request_id: str) -> events_pb2.ModeChanged:
    return events_pb2.ModeChanged(
        previous_mode=MODE_TO_PROTO[previous], mode=MODE_TO_PROTO[mode], request_id=request_id
    )
