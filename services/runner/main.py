"""Runner process wiring (shell, no logic)."""

from __future__ import annotations

from pathlib import Path

from gyre.consume import Consumer
from gyre.db.outbox import OutboxRelay
from gyre.proxy.v1 import proxy_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.rpc_telemetry import channel as traced_channel
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.runtime import ServiceHost, Worker, connect
from gyre.sandbox.host import SandboxHost
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.settings import KernelSettings
from services.runner import metrics, repo
from services.runner.config import AGENT_FILES, RunnerSettings
from services.runner.consumer import GradedEvents, ScheduledEvents
from services.runner.registration import Registration
from services.runner.service import RunnerServicer
from services.runner.supervisor import Supervisor

NAME = "runner"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: RunnerSettings, kernel: KernelSettings) -> ServiceHost:
    host, _ = await build_with_supervisor(settings, kernel)
    return host


async def build_with_supervisor(
    settings: RunnerSettings, kernel: KernelSettings
) -> tuple[ServiceHost, Supervisor]:
    """The host and its supervisor (tests and benchmarks release sandboxes through it)."""
    sandboxes = SandboxHost(
        settings.sandbox_root,
        mode=settings.sandbox_mode,
        uid_base=settings.uid_base,
        runtime=(*AGENT_FILES, *settings.sandbox_runtime),
    )
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    proxy = (
        proxy_pb2_grpc.ProxyServiceStub(traced_channel(settings.proxy_address))
        if settings.proxy_address
        else None
    )
    supervisor = Supervisor(
        sessions=conns.sessions, relay=relay, host=sandboxes, settings=settings, proxy=proxy
    )
    engine = find_engine()
    supervisor.containers = OciBackend(engine) if engine else None
    await supervisor.recover()  # re-attaches to running containers, sweeps the others
    metrics.register(supervisor)
    scheduled = Consumer(conns.bus, ScheduledEvents(conns.sessions, relay, supervisor).spec())
    server = GrpcServer(
        service_names=[runner_pb2.DESCRIPTOR.services_by_name["RunnerService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    runner_pb2_grpc.add_RunnerServiceServicer_to_server(
        RunnerServicer(conns.sessions, supervisor, settings), server.server
    )
    graded = Consumer(conns.bus, GradedEvents(supervisor).spec())
    workers: list[Worker] = [relay.run, scheduled.run, graded.run, supervisor.run]
    if settings.scheduler_address:
        scheduler = scheduler_pb2_grpc.SchedulerServiceStub(traced_channel(settings.scheduler_address))
        workers.append(Registration(settings, scheduler).run)
    return ServiceHost(name=NAME, server=server, connections=conns, workers=workers), supervisor
