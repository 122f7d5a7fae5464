"""Cell agent process wiring (shell, no logic)."""

from __future__ import annotations

import asyncio

from gyre.cell.v1 import cell_pb2, cell_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from services.cell.agent import CellAgent, TrainingWorker
from services.cell.config import CellSettings

NAME = "cell"


async def build(settings: CellSettings, kernel: KernelSettings) -> ServiceHost:
    worker = None if settings.core else TrainingWorker(settings)
    if worker is not None:
        await worker.start()
    agent = CellAgent(settings, worker)
    server = GrpcServer(
        service_names=[cell_pb2.DESCRIPTOR.services_by_name["CellService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    cell_pb2_grpc.add_CellServiceServicer_to_server(agent, server.server)

    async def beat(stop: asyncio.Event) -> None:
        agent.address = settings.advertise_address or server.address
        try:
            await agent.run(stop)
        finally:
            if worker is not None:
                await worker.stop()

    return ServiceHost(name=NAME, server=server, connections=None, workers=[beat])
