"""Role switches of one satellite cell through the other services' contracts, phase by phase (shell).

Rollout -> training:
1. *drain*: the proxy's `DrainCell` stops routing to the cell and moves its in-flight calls, with
   their KV cache, to other rollout cells (the harness's stream continues);
2. *release*: the engine's `DrainEngine(release_memory)` frees its weights and caches;
3. *join*: the trainer's `JoinStep` admits the cell into the step in progress, and the cell's
   agent (`CellService.StartTraining`) hands the rendezvous to its warm training worker.

Training -> rollout:
1. *leave*: the trainer's `LeaveStep` releases the cell at its next microbatch boundary;
2. *weight load*: the engine's `UpdateWeights` loads the trainer's current weights;
3. *route*: the proxy's `RegisterEngine` routes calls to it again.

A phase that fails sends the cell back the way it came, so it always ends in a role it can hold:
a drain that could not move every call leaves the cell serving (routed again); a failed join
reloads its weights and routes it again; a failed weight load sends it back to training; and if
that fails too, the cell is reported `lost` (its agent must register again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
import structlog

from gyre.cell.v1 import cell_pb2, cell_pb2_grpc
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.tls import aio_channel
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.scheduler.cells import CellRecord

log = structlog.get_logger(__name__)
ROLLOUT, TRAINING, LOST = pb.CELL_ROLE_ROLLOUT, pb.CELL_ROLE_TRAINING, pb.CELL_ROLE_LOST


class _PhaseFailed(Exception):
    def __init__(self, phase: str, exc: BaseException | str) -> None:
        detail = f"{exc.code().name} {exc.details()}" if isinstance(exc, grpc.aio.AioRpcError) else str(exc)
        super().__init__(f"{phase}: {detail}")


@dataclass(slots=True)
class _Channels:
    """One channel per address, reused across switches (a switch must not pay a connection)."""

    open: dict[str, grpc.aio.Channel] = field(default_factory=dict)

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self.open.get(address)
        if channel is None:
            channel = self.open[address] = aio_channel(address)
        return channel

    async def close(self) -> None:
        for channel in self.open.values():
            await channel.close(None)
        self.open.clear()


class Switcher:
    def __init__(
        self, *, proxy_address: str, drain_timeout_s: float = 30.0, rpc_timeout_s: float = 60.0
    ) -> None:
        self.proxy_address = proxy_address
        self.drain_timeout_s = drain_timeout_s
        self.rpc_timeout_s = rpc_timeout_s
        self.channels = _Channels()

    async def close(self) -> None:
        await self.channels.close()

    def _proxy(self) -> proxy_pb2_grpc.ProxyServiceAsyncStub:
        return proxy_pb2_grpc.ProxyServiceStub(self.channels.get(self.proxy_address))

    def _engine(self, cell: CellRecord) -> engine_pb2_grpc.EngineServiceAsyncStub:
        return engine_pb2_grpc.EngineServiceStub(self.channels.get(cell.engine_address))

    def _trainer(self, core: CellRecord) -> trainer_pb2_grpc.TrainerServiceAsyncStub:
        return trainer_pb2_grpc.TrainerServiceStub(self.channels.get(core.agent_address))

    def _agent(self, cell: CellRecord) -> cell_pb2_grpc.CellServiceAsyncStub:
        return cell_pb2_grpc.CellServiceStub(self.channels.get(cell.agent_address))

    async def route(self, cell: CellRecord, *, request_id: str) -> None:
        """Route calls to the cell's engine (a cell entering, or returning to, rollout)."""
        await self._proxy().RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id=request_id,
                cell_id=cell.cell_id,
                engine_id=cell.engine_id,
                address=cell.engine_address,
            ),
            timeout=self.rpc_timeout_s,
        )

    async def unroute(self, cell: CellRecord, *, request_id: str, timeout_s: float = 1.0) -> None:
        """Stop routing calls to the cell (its in-flight calls move where they still can)."""
        await self._proxy().DrainCell(
            proxy_pb2.DrainCellRequest(request_id=request_id, cell_id=cell.cell_id, timeout_s=timeout_s),
            timeout=timeout_s + self.rpc_timeout_s,
        )

    async def to_training(self, cell: CellRecord, *, core: CellRecord, request_id: str) -> pb.CellSwitch:
        sw = pb.CellSwitch(cell_id=cell.cell_id, from_role=ROLLOUT, to_role=TRAINING, ok=True)
        started = time.perf_counter()
        try:
            await self._drain(cell, sw, request_id=request_id)
        except _PhaseFailed as exc:
            return await self._back_to_rollout(cell, core, sw, exc, request_id=request_id, reload=False)
        try:
            t = time.perf_counter()
            await self._engine(cell).DrainEngine(
                engine_pb2.DrainEngineRequest(request_id=f"{request_id}:release", release_memory=True),
                timeout=self.rpc_timeout_s,
            )
            sw.release_s = time.perf_counter() - t
            await self._join(cell, core, sw, request_id=request_id)
        except (_PhaseFailed, grpc.aio.AioRpcError) as exc:
            return await self._back_to_rollout(cell, core, sw, exc, request_id=request_id, reload=True)
        sw.total_s = time.perf_counter() - started
        return sw

    async def to_rollout(self, cell: CellRecord, *, core: CellRecord, request_id: str) -> pb.CellSwitch:
        sw = pb.CellSwitch(cell_id=cell.cell_id, from_role=TRAINING, to_role=ROLLOUT, ok=True)
        started = time.perf_counter()
        t = time.perf_counter()
        try:
            await self._trainer(core).LeaveStep(
                trainer_pb2.LeaveStepRequest(request_id=f"{request_id}:leave", cell_id=cell.cell_id),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # NOT_FOUND: no longer a member, nothing to leave
                sw.ok, sw.to_role, sw.error = False, TRAINING, str(_PhaseFailed("leave", exc))
                sw.total_s = time.perf_counter() - started
                return sw
        sw.leave_s = time.perf_counter() - t
        try:
            await self._load_weights(cell, core, sw, request_id=request_id)
            t = time.perf_counter()
            await self.route(cell, request_id=f"{request_id}:route")
            sw.route_s = time.perf_counter() - t
        except (_PhaseFailed, grpc.aio.AioRpcError) as exc:
            sw.ok, sw.error = False, str(exc)
            try:  # it cannot serve: back into training, where it was
                await self._join(cell, core, sw, request_id=f"{request_id}:back")
                sw.to_role = TRAINING
            except (_PhaseFailed, grpc.aio.AioRpcError) as again:
                sw.to_role, sw.error = LOST, f"{sw.error}; back to training failed too: {again}"
        sw.total_s = time.perf_counter() - started
        return sw

    async def _drain(self, cell: CellRecord, sw: pb.CellSwitch, *, request_id: str) -> None:
        t = time.perf_counter()
        try:
            drained = await self._proxy().DrainCell(
                proxy_pb2.DrainCellRequest(
                    request_id=f"{request_id}:drain", cell_id=cell.cell_id, timeout_s=self.drain_timeout_s
                ),
                timeout=self.drain_timeout_s + self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise _PhaseFailed("drain", exc) from None
        sw.drain_s = time.perf_counter() - t
        sw.num_calls_migrated = drained.num_calls_migrated
        sw.num_calls_recomputed = drained.num_calls_recomputed
        sw.kv_transferred_bytes = drained.kv_transferred_bytes
        if not drained.drained:
            raise _PhaseFailed(
                "drain", f"{drained.num_calls_remaining} calls could not move (no room elsewhere)"
            )

    async def _join(self, cell: CellRecord, core: CellRecord, sw: pb.CellSwitch, *, request_id: str) -> None:
        t = time.perf_counter()
        try:
            ticket = await self._trainer(core).JoinStep(
                trainer_pb2.JoinStepRequest(request_id=f"{request_id}:join", cell_id=cell.cell_id),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise _PhaseFailed("join", exc) from None
        if not ticket.admitted:
            raise _PhaseFailed("join", f"the trainer declined: {ticket.reason}")
        try:
            await self._agent(cell).StartTraining(
                cell_pb2.StartTrainingRequest(
                    request_id=f"{request_id}:start", rendezvous_uri=ticket.rendezvous_uri
                ),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            await self._leave_quietly(cell, core, request_id=f"{request_id}:unjoin")
            raise _PhaseFailed("join", exc) from None
        sw.join_s = time.perf_counter() - t

    async def _load_weights(
        self, cell: CellRecord, core: CellRecord, sw: pb.CellSwitch, *, request_id: str
    ) -> None:
        t = time.perf_counter()
        try:
            status = await self._trainer(core).GetStatus(
                trainer_pb2.GetStatusRequest(), timeout=self.rpc_timeout_s
            )
            await self._engine(cell).UpdateWeights(
                engine_pb2.UpdateWeightsRequest(
                    request_id=f"{request_id}:weights", version=status.version, source_uri=status.weights_uri
                ),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            raise _PhaseFailed("weight load", exc) from None
        sw.weight_load_s = time.perf_counter() - t

    async def _leave_quietly(self, cell: CellRecord, core: CellRecord, *, request_id: str) -> None:
        try:
            await self._trainer(core).LeaveStep(
                trainer_pb2.LeaveStepRequest(request_id=request_id, cell_id=cell.cell_id),
                timeout=self.rpc_timeout_s,
            )
        except grpc.aio.AioRpcError as exc:
            log.info("leave_after_failed_join", cell_id=cell.cell_id, error=exc.code().name)

    async def _back_to_rollout(
        self,
        cell: CellRecord,
        core: CellRecord,
        sw: pb.CellSwitch,
        exc: BaseException,
        *,
        request_id: str,
        reload: bool,
    ) -> pb.CellSwitch:
        """The switch to training failed: serve again (reloading the weights if they were released)."""
        sw.ok, sw.error, sw.to_role = False, str(exc), ROLLOUT
        try:
            if reload:
                await self._load_weights(cell, core, sw, request_id=f"{request_id}:back")
            await self.route(cell, request_id=f"{request_id}:back-route")
        except (_PhaseFailed, grpc.aio.AioRpcError) as again:
            sw.to_role, sw.error = LOST, f"{sw.error}; back to rollout failed too: {again}"
        log.warning(
            "cell_switch_failed", cell_id=cell.cell_id, error=sw.error, role=pb.CellRole.Name(sw.to_role)
        )
        return sw
