"""Scheduler process wiring (shell, no logic)."""

from __future__ import annotations

from pathlib import Path

from gyre.db.outbox import OutboxRelay
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, connect
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from services.scheduler import repo
from services.scheduler.catalog import load_catalog
from services.scheduler.config import SchedulerSettings
from services.scheduler.service import SchedulerServicer

NAME = "scheduler"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: SchedulerSettings, kernel: KernelSettings) -> ServiceHost:
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    server = GrpcServer(
        service_names=[scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(
        SchedulerServicer(conns.sessions, relay, catalog=load_catalog(settings)), server.server
    )
    return ServiceHost(name=NAME, server=server, connections=conns, workers=[relay.run])
