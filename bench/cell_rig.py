"""Live cells in one process tree: scheduler, proxy, trainer (core cell), torch engines and cell
agents with warm training workers, on given NATS and Postgres (shell; shared by the role-switch
benchmark and the integration test).

Everything is real except its placement: the services run in-process (one event loop) and each
satellite's training worker is a process of its own, as on a cluster. The scheduler routes
every satellite's engine when its agent registers: nothing here calls `RegisterEngine` itself.
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc

from bench import engine_process
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.settings import KernelSettings


@dataclass(slots=True, kw_only=True)
class LiveCells:
    scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub
    http_url: str
    satellites: tuple[str, ...]
    agents: dict[str, ServiceHost]
    """Each satellite's agent (stopping one takes its training worker down: a failure to inject)."""
    scheduler_address: str = ""
    trainer_address: str = ""
    trajectory_address: str = ""
    """Empty without a loop (no trajectory service runs)."""

    async def register_execution(
        self, *, execution_id: str = "", task_id: str = "", admitted_version: int = 0
    ) -> str:
        """A token for an execution, a fresh one unless named (what the runner does for a harness):
        its calls are served from weights of `admitted_version` or newer."""
        token = "gyre-" + secrets.token_hex(24)
        request = proxy_pb2.RegisterExecutionTokenRequest(
            request_id=f"tok-{uuid.uuid4().hex[:12]}", token=token
        )
        request.execution.execution_id = execution_id or str(uuid.uuid4())
        request.execution.task_id = task_id or str(uuid.uuid4())
        request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
        request.min_policy_version.steps = admitted_version
        await self.proxy.RegisterExecutionToken(request)
        return token

    async def roles(self) -> dict[str, pb.CellRole.ValueType]:
        cells = await self.scheduler.GetCells(pb.GetCellsRequest())
        return {c.cell_id: c.role for c in cells.cells}

    async def busy_cell(self) -> str:
        routing = await self.proxy.GetRouting(proxy_pb2.GetRoutingRequest())
        return next(r.cell_id for r in routing.routes if r.num_in_flight_calls)

    async def switch(self, cell_id: str, role: pb.CellRole.ValueType) -> pb.CellSwitch:
        answer = await self.scheduler.SwitchCell(
            pb.SwitchCellRequest(request_id=f"switch-{uuid.uuid4().hex[:12]}", cell_id=cell_id, role=role)
        )
        return answer.switch


async def _until(check: object, *, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():  # type: ignore[operator]
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Loop:
    """With a loop, a trajectory service runs too and the trainer trains what the scheduler assigns."""

    mode: str = "gyre"
    groups_per_step: int = 1
    max_staleness: int = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Emulated:
    """EMULATION ONLY: the satellites' engines are emulated (`gyre_app.emulation`), all in this
    process, timed by `profile` divided by `time_scale`; their agents keep no training worker."""

    profile: Path
    time_scale: float = 1.0
    reply_tokens: int = 64


@asynccontextmanager
async def live_cells(
    kernel: KernelSettings,
    model_dir: Path,
    state_dir: Path,
    *,
    satellites: int = 2,
    slots: int = 4,
    loop: Loop | None = None,
    engine_processes: bool = False,
    emulated: Emulated | None = None,
) -> AsyncIterator[LiveCells]:
    """Start everything, wait until every cell is registered, yield, stop everything.

    `engine_processes`: each engine runs as a process of its own (`bench.engine_process`, with a
    loop only: it publishes events and follows the trainer's weights) instead of in this one."""
    from services.cell.config import CellSettings
    from services.cell.main import build as build_cell
    from services.engine.config import EngineSettings
    from services.engine.main import build as build_engine
    from services.proxy.config import ProxySettings
    from services.proxy.main import build_proxy
    from services.scheduler.config import SchedulerSettings
    from services.scheduler.main import build as build_scheduler
    from services.trainer.config import TrainerSettings
    from services.trainer.main import build as build_trainer
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build as build_trajectory

    hosts: list[ServiceHost] = []
    channels: list[grpc.aio.Channel] = []
    processes = AsyncExitStack()

    async def start(host: ServiceHost) -> ServiceHost:
        await host.start()
        hosts.append(host)
        return host

    try:
        proxy = await build_proxy(ProxySettings(model_dir=model_dir, model_name="tiny"), kernel)
        await start(proxy.host)
        policy: dict[str, Any] = (
            {"mode": loop.mode, "groups_per_step": loop.groups_per_step, "max_staleness": loop.max_staleness}
            if loop
            else {}
        )
        scheduler = await start(
            await build_scheduler(
                SchedulerSettings(
                    port=0,
                    proxy_address=proxy.host.address,
                    tick_s=0.2,
                    harnesses=("scripted",),  # the benchmark plays the runner's harness itself
                    **policy,
                ),
                kernel,
            )
        )
        # Without a loop no group reaches the trainer: it only admits cells.
        trajectory = await start(await build_trajectory(TrajectorySettings(port=0), kernel)) if loop else None
        emulated_trainer = _emulated_trainer(emulated) if emulated else {}
        trainer = await start(
            await build_trainer(
                TrainerSettings(
                    port=0,
                    state_dir=state_dir / "trainer",
                    model_dir=model_dir,
                    trajectory_address=trajectory.address if trajectory else "127.0.0.1:1",
                    steps_from_scheduler=loop is not None,
                    groups_per_step=loop.groups_per_step if loop else 1,
                    max_staleness_steps=loop.max_staleness if loop else 4,
                    **emulated_trainer,
                ),
                kernel,
            )
        )
        await start(
            await build_cell(
                CellSettings(
                    cell_id="cell-0",
                    core=True,
                    scheduler_address=scheduler.address,
                    trainer_address=trainer.address,
                ),
                kernel,
            )
        )
        names = tuple(f"cell-{i}" for i in range(1, satellites + 1))
        if emulated is not None:
            engine_addresses = list(
                (
                    await processes.enter_async_context(_emulated_engines(kernel, model_dir, names, emulated))
                ).values()
            )
        elif engine_processes and loop:
            engine_addresses = await processes.enter_async_context(
                engine_process.engine_processes(kernel, model_dir, names, state_dir / "logs")
            )
        else:
            engine_addresses = []
            for name in names:
                engine = await build_engine(
                    EngineSettings(
                        model_dir=model_dir,
                        engine_id=f"engine-{name}",
                        cell_id=name,
                        num_threads=1,
                        publish_events=loop is not None,
                        follow_weights=loop is not None,  # with a loop, engines follow the trainer
                        init_model_if_missing=False,
                    ),
                    kernel,
                )
                engine_addresses.append((await start(engine)).address)
        agents = [
            (_emulated_agent if emulated else build_cell)(
                CellSettings(
                    cell_id=name,
                    scheduler_address=scheduler.address,
                    engine_address=address,
                    slots=slots,
                    worker_ready_timeout_s=300,  # torch's import on a loaded shared machine
                ),
                kernel,
            )
            for name, address in zip(names, engine_addresses, strict=True)
        ]
        started = await asyncio.gather(*agents)  # the workers' imports overlap
        for agent in started:
            await start(agent)
        channels += [
            grpc.aio.insecure_channel(scheduler.address),
            grpc.aio.insecure_channel(proxy.host.address),
        ]
        cells = LiveCells(
            scheduler=scheduler_pb2_grpc.SchedulerServiceStub(channels[0]),  # type: ignore[arg-type]
            proxy=proxy_pb2_grpc.ProxyServiceStub(channels[1]),  # type: ignore[arg-type]
            http_url=proxy.http_url,
            satellites=names,
            agents=dict(zip(names, started, strict=True)),
            scheduler_address=scheduler.address,
            trainer_address=trainer.address,
            trajectory_address=trajectory.address if trajectory else "",
        )

        async def all_registered() -> bool:
            routing = await cells.proxy.GetRouting(proxy_pb2.GetRoutingRequest())
            routed = {r.cell_id for r in routing.routes if r.state == proxy_pb2.ROUTE_STATE_ACTIVE}
            return len(await cells.roles()) == satellites + 1 and routed == set(names)

        await _until(all_registered, timeout_s=60, what="every cell to register and be routed")
        yield cells
    finally:
        for channel in channels:
            await channel.close(None)
        for host in reversed(hosts):
            await host.stop(grace_s=1)
        await processes.aclose()


def _emulated_trainer(emulated: Emulated) -> dict[str, Any]:
    """The trainer's settings for modelled steps: the profile's training rate and all-reduce."""
    from gyre_app.emulation.profile import load_profile

    profile = load_profile(emulated.profile)
    return {
        "emulated_tokens_per_s": profile.training_tokens_per_s_per_cell,
        "emulated_gradient_bytes": profile.weight_bytes,
        "emulated_link_bytes_per_s": profile["cell.link_bytes_per_s"],
        "emulated_time_scale": emulated.time_scale,
    }


async def _emulated_agent(settings: Any, kernel: KernelSettings) -> ServiceHost:
    from gyre_app.emulation.agents import build_emulated_agent

    return build_emulated_agent(settings)


@asynccontextmanager
async def _emulated_engines(
    kernel: KernelSettings, model_dir: Path, names: tuple[str, ...], emulated: Emulated
) -> AsyncIterator[dict[str, str]]:
    """Every satellite's engine emulated in this process, following the trainer's weights."""
    from gyre.bus import Bus, BusConfig
    from gyre_app.emulation.cells import EmulatedCells, available_memory_bytes, vocabulary
    from gyre_app.emulation.profile import check_cells, load_profile

    assert kernel.nats_url is not None
    profile = load_profile(emulated.profile)
    check_cells(profile, len(names) + 1, available_bytes=available_memory_bytes())  # before anything starts
    bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix), name="emulated-cells")
    host = EmulatedCells(profile)
    vocab_size, eos_id = vocabulary(model_dir)
    try:
        await host.start(
            names,
            vocab_size=vocab_size,
            eos_id=eos_id,
            time_scale=emulated.time_scale,
            reply_tokens=emulated.reply_tokens,
            bus=bus,
        )
        yield host.addresses
    finally:
        await host.close()
        await bus.close()
