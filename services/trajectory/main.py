"""Trajectory process wiring (shell, no logic)."""

from __future__ import annotations

from pathlib import Path

from gyre.consume import Consumer
from gyre.db.outbox import OutboxRelay
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, connect
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trajectory import repo
from services.trajectory.call_events import CallEvents
from services.trajectory.call_log import CallLog
from services.trajectory.config import TrajectorySettings
from services.trajectory.consumer import RewardEvents, TaskEvents
from services.trajectory.service import TrajectoryServicer

NAME = "trajectory"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: TrajectorySettings, kernel: KernelSettings) -> ServiceHost:
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    calls = CallLog(cache_size=settings.tree_cache_size)
    tasks = Consumer(conns.bus, TaskEvents(conns.sessions, relay.poke).spec())
    rewards = Consumer(conns.bus, RewardEvents(conns.sessions, relay.poke).spec())
    call_events = Consumer(conns.bus, CallEvents(conns.sessions, calls, relay.poke).spec())
    server = GrpcServer(
        service_names=[trajectory_pb2.DESCRIPTOR.services_by_name["TrajectoryService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    trajectory_pb2_grpc.add_TrajectoryServiceServicer_to_server(
        TrajectoryServicer(conns.sessions, calls), server.server
    )
    return ServiceHost(
        name=NAME,
        server=server,
        connections=conns,
        workers=[relay.run, tasks.run, rewards.run, call_events.run],
    )
