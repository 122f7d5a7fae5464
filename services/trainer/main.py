"""Trainer process wiring (shell, no logic)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch

from gyre.consume import Consumer
from gyre.db.outbox import OutboxRelay
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, connect
from gyre.settings import KernelSettings
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from services.trainer import metrics, repo
from services.trainer.config import TrainerSettings
from services.trainer.consumer import AssignmentEvents, GroupEvents
from services.trainer.core_cell import open_core_cell
from services.trainer.loop import StepLoop, announce_initial_weights
from services.trainer.service import TrainerServicer
from services.trainer.source import TrajectorySamples

NAME = "trainer"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: TrainerSettings, kernel: KernelSettings) -> ServiceHost:
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    async with conns.sessions() as session:
        last = await repo.last_step(session)
    cell, initial = await asyncio.to_thread(
        open_core_cell,
        settings,
        version=last.version if last else 0,
        checkpoint_uri=last.checkpoint_uri if last else None,
    )
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    metrics.register()
    if initial is not None:
        await announce_initial_weights(conns.sessions, relay, initial)
    source = TrajectorySamples(settings.trajectory_address, j_max=settings.j_max)
    loop = StepLoop(settings=settings, sessions=conns.sessions, relay=relay, cell=cell, source=source)
    groups = Consumer(conns.bus, GroupEvents(conns.sessions, on_queued=loop.poke).spec())
    consumers = [groups]
    if settings.steps_from_scheduler:
        consumers.append(Consumer(conns.bus, AssignmentEvents(conns.sessions, on_assigned=loop.poke).spec()))
    server = GrpcServer(
        service_names=[trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    trainer_pb2_grpc.add_TrainerServiceServicer_to_server(
        TrainerServicer(conns.sessions, relay, cell, loop), server.server
    )
    return ServiceHost(
        name=NAME,
        server=server,
        connections=conns,
        workers=[relay.run, *(c.run for c in consumers), loop.run],
    )
