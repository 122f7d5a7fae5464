"""Cell agents of emulated satellites: the real CellService and registration, no training process (shell).

EMULATION ONLY. A real satellite's agent keeps a warm training worker (a torch process) so the
scheduler can switch the cell into training. Emulated cells run by the hundred in one process,
so they keep none yet: their worker declines `StartTraining` with UNAVAILABLE, which the
scheduler's switch treats as a failed join (it takes the cell out of the step and routes it
again), so every emulated satellite stays in rollout and the core cell trains every step.
Training workers that join steps through the membership protocol with modelled time are the
next piece of issue 25; until then an emulated run measures rollout and the control plane, not
the elastic training gain.
"""

from __future__ import annotations

import asyncio

from gyre.cell.v1 import cell_pb2, cell_pb2_grpc
from gyre.errors import Unavailable
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost
from services.cell.agent import CellAgent, TrainingWorker
from services.cell.config import CellSettings


class DecliningWorker(TrainingWorker):
    """Stands where the warm training worker would: never started, declines every rendezvous."""

    async def start(self) -> None:
        return None

    async def train(self, rendezvous_uri: str, *, timeout_s: float = 10.0) -> None:
        raise Unavailable(
            f"{self.settings.cell_id} is an emulated cell without a training worker (emulation only): "
            "it serves rollout only"
        )

    async def stop(self) -> None:
        return None


def build_emulated_agent(settings: CellSettings) -> ServiceHost:
    """What `services.cell.main.build` wires, with the declining worker in place of the process."""
    agent = CellAgent(settings, DecliningWorker(settings))
    server = GrpcServer(
        service_names=[cell_pb2.DESCRIPTOR.services_by_name["CellService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    cell_pb2_grpc.add_CellServiceServicer_to_server(agent, server.server)

    async def beat(stop: asyncio.Event) -> None:
        agent.address = settings.advertise_address or server.address
        await agent.run(stop)

    return ServiceHost(name=f"cell-agent-{settings.cell_id}", server=server, connections=None, workers=[beat])
