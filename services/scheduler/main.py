"""Scheduler process wiring (shell, no logic)."""

from __future__ import annotations

from pathlib import Path

from gyre.consume import Consumer
from gyre.db.outbox import OutboxRelay
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, Worker, connect
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from services.scheduler import metrics, repo
from services.scheduler.catalog import load_catalog
from services.scheduler.config import SchedulerSettings
from services.scheduler.driver import LiveDriver
from services.scheduler.lifecycle import LifecycleEvents
from services.scheduler.prompt_window import PromptWindow
from services.scheduler.service import SchedulerServicer
from services.scheduler.switching import Switcher

NAME = "scheduler"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: SchedulerSettings, kernel: KernelSettings) -> ServiceHost:
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    metrics.register()
    server = GrpcServer(
        service_names=[scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    switcher = (
        Switcher(proxy_address=settings.proxy_address, drain_timeout_s=settings.drain_timeout_s)
        if settings.proxy_address
        else None
    )
    servicer = SchedulerServicer(
        conns.sessions,
        relay,
        switcher,
        default_mode=settings.mode,
        lost_after_s=settings.cell_lost_after_s,
        admission=settings.admission,
        runner_address=settings.runner_address,
        catalog=load_catalog(settings),
        prompt_window=PromptWindow(settings.model_dir),
    )
    driver = LiveDriver(conns.sessions, relay, servicer, settings)
    servicer.on_change = driver.poke
    lifecycle = [
        Consumer(conns.bus, spec)
        for spec in LifecycleEvents(
            conns.sessions, default_mode=settings.mode, on_change=driver.poke, on_enqueued=relay.poke
        ).specs()
    ]
    scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(servicer, server.server)
    workers: list[Worker] = [relay.run, servicer.watch_heartbeats, *(c.run for c in lifecycle)]
    if switcher is not None:  # without a proxy there are no cells to drive
        workers += [driver.run, Consumer(conns.bus, driver.spec()).run]
    return ServiceHost(name=NAME, server=server, connections=conns, workers=workers)
