"""A cell's agent: registers the cell with the scheduler, beats, and keeps its training worker warm (shell).

A satellite cell is two things the scheduler switches between: its engine (its own process,
serving calls while the cell is in rollout; the scheduler drains, releases and reloads it) and
a *training worker*, the trainer's satellite in `--standby` mode, started once with the agent
so its imports are paid before any switch. `StartTraining` hands the worker the rendezvous the
trainer gave the scheduler (`JoinStep`); the trainer's `LeaveStep` releases it, and it waits
for the next one. The core cell's agent registers the trainer as the core and keeps no worker.

The agent registers once the worker is ready (so a registered cell can hold either role), beats
every `heartbeat_s`, and registers again when the scheduler no longer knows it or declared it
lost (a scheduler restart mid-switch, or a pause longer than the loss limit).
"""

from __future__ import annotations

import asyncio
import sys
import time

import grpc
import structlog

from gyre.cell.v1 import cell_pb2, cell_pb2_grpc
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.errors import Conflict, InvalidArgument, Unavailable
from gyre.ids import new_uuid7, validate_request_id
from gyre.rpc import Context
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.tls import aio_channel
from services.cell.config import CellSettings

log = structlog.get_logger(__name__)
RELEASE_WAIT_S = 5.0
"""How long `StartTraining` waits for the worker to report the end of its previous session."""
WORKER_MODULE = "services.trainer.satellite"  # run as a process: the agent imports no other service


class TrainingWorker:
    """The warm satellite process and the lines it answers on stdout."""

    def __init__(self, settings: CellSettings) -> None:
        self.settings = settings
        self.proc: asyncio.subprocess.Process | None = None
        self.lines: asyncio.Queue[str] = asyncio.Queue()
        self.training = False
        self.sessions = 0
        self.microbatches = 0
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.training, self.lines = False, asyncio.Queue()  # a restart begins afresh
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            WORKER_MODULE,
            "--cell-id",
            self.settings.cell_id,
            "--standby",
            "--threads",
            str(self.settings.worker_threads),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read())
        line = await asyncio.wait_for(self.lines.get(), timeout=self.settings.worker_ready_timeout_s)
        if line != "ready":
            raise RuntimeError(f"training worker of {self.settings.cell_id} said {line!r} instead of ready")

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for raw in self.proc.stdout:
            line = raw.decode().strip()
            if line.startswith("released"):
                self.training = False
                self.sessions += 1
                self.microbatches += int(line.split()[1])
                log.info("training_worker_released", cell_id=self.settings.cell_id, line=line)
            else:
                await self.lines.put(line)
        self.training = False

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def train(self, rendezvous_uri: str, *, timeout_s: float = 10.0) -> None:
        if not self.alive:
            raise Unavailable(f"the training worker of {self.settings.cell_id} is not running")
        for _ in range(int(RELEASE_WAIT_S / 0.01)):  # a release the worker has yet to report
            if not self.training:
                break
            await asyncio.sleep(0.01)
        if self.training:
            raise Conflict(f"{self.settings.cell_id} is already training; the trainer must release it first")
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(f"{rendezvous_uri}\n".encode())
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.lines.get(), timeout=timeout_s)
        if not line.startswith("accepted"):
            raise InvalidArgument("rendezvous_uri", line)
        self.training = True

    async def stop(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        assert self.proc.stdin is not None
        self.proc.stdin.close()  # an idle worker ends at EOF; one still training is killed
        try:
            await asyncio.wait_for(self.proc.wait(), timeout=1)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            self._reader.cancel()


class CellAgent(cell_pb2_grpc.CellServiceServicer):
    def __init__(self, settings: CellSettings, worker: TrainingWorker | None) -> None:
        self.settings = settings
        self.worker = worker
        self.answers: dict[str, cell_pb2.StartTrainingResponse] = {}
        self.address = ""
        self._revive: asyncio.Task[None] | None = None

    async def StartTraining(
        self, request: cell_pb2.StartTrainingRequest, context: Context
    ) -> cell_pb2.StartTrainingResponse:
        validate_request_id(request.request_id)
        if request.request_id in self.answers:
            return self.answers[request.request_id]
        if not request.rendezvous_uri.startswith("tcp://"):
            raise InvalidArgument(
                "rendezvous_uri", f"must be tcp://host:port, got {request.rendezvous_uri!r}"
            )
        if self.worker is None:
            raise Conflict("the core cell always trains: it takes no rendezvous")
        started = time.perf_counter()
        await self.worker.train(request.rendezvous_uri)
        answer = cell_pb2.StartTrainingResponse(duration_s=time.perf_counter() - started)
        self.answers[request.request_id] = answer
        return answer

    async def GetCellStatus(
        self, request: cell_pb2.GetCellStatusRequest, context: Context
    ) -> cell_pb2.GetCellStatusResponse:
        w = self.worker
        return cell_pb2.GetCellStatusResponse(
            cell_id=self.settings.cell_id,
            training=bool(w and w.training),
            num_training_sessions=w.sessions if w else 0,
            num_microbatches=w.microbatches if w else 0,
        )

    # -- registration and heartbeats ------------------------------------------------------------

    async def registration(self) -> pb.RegisterCellRequest:
        s = self.settings
        if s.core:
            return pb.RegisterCellRequest(
                request_id=new_uuid7(), cell_id=s.cell_id, core=True, agent_address=s.trainer_address
            )
        async with aio_channel(s.engine_address) as channel:
            stats = await engine_pb2_grpc.EngineServiceStub(channel).GetEngineStats(  # type: ignore[misc]
                engine_pb2.GetEngineStatsRequest(), timeout=30
            )
        return pb.RegisterCellRequest(
            request_id=new_uuid7(),
            cell_id=s.cell_id,
            slots=s.slots,
            model_fingerprint=stats.model_fingerprint,
            engine_id=stats.engine_id,
            engine_address=s.engine_address,
            agent_address=self.address,
        )

    def _revive_worker(self) -> None:
        """A training worker that died (killed, out of memory) is started again in the background,
        so the cell can train again; heartbeats go on meanwhile."""
        w = self.worker
        if w is None or w.proc is None or w.alive or (self._revive is not None and not self._revive.done()):
            return
        log.warning("training_worker_died", cell_id=self.settings.cell_id, returncode=w.proc.returncode)
        self._revive = asyncio.create_task(w.start())

    async def run(self, stop: asyncio.Event) -> None:
        """Register, then beat until stopped; register again whenever the scheduler lost the cell."""
        async with aio_channel(self.settings.scheduler_address) as channel:
            scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub = scheduler_pb2_grpc.SchedulerServiceStub(
                channel
            )  # type: ignore[assignment]
            registered = False
            while not stop.is_set():
                self._revive_worker()
                try:
                    if not registered:
                        answer = await scheduler.RegisterCell(await self.registration(), timeout=60)
                        registered = True
                        log.info(
                            "cell_registered",
                            cell_id=self.settings.cell_id,
                            role=pb.CellRole.Name(answer.cell.role),
                        )
                    beat = await scheduler.SendHeartbeat(
                        pb.SendHeartbeatRequest(cell_id=self.settings.cell_id), timeout=5
                    )
                    registered = beat.role != pb.CELL_ROLE_LOST
                except grpc.aio.AioRpcError as exc:
                    if exc.code() == grpc.StatusCode.NOT_FOUND:
                        registered = False
                    log.info("scheduler_unreachable", cell_id=self.settings.cell_id, error=exc.code().name)
                try:
                    await asyncio.wait_for(stop.wait(), timeout=self.settings.heartbeat_s)
                except TimeoutError:
                    pass
