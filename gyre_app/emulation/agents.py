"""Cell agents of emulated satellites: the real CellService and registration, no training process (shell).

EMULATION ONLY. A real satellite's agent keeps a warm training worker (a torch process) that
takes the rendezvous and computes microbatches. An emulated cell's worker computes nothing: it
accepts the rendezvous at once, and the trainer, taking modelled steps
(`services.trainer.dp.emulated`), counts the cell as a replica from its next microbatch round,
because `JoinStep` put it into the real membership; `LeaveStep` takes it out the same way. So
the scheduler's switches run every phase (drain, KV moves, release, join, leave, weight load)
against real services, and only the arithmetic is modelled.
"""

from __future__ import annotations

import asyncio

from gyre.cell.v1 import cell_pb2, cell_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost
from services.cell.agent import CellAgent, TrainingWorker
from services.cell.config import CellSettings


class EmulatedWorker(TrainingWorker):
    """Stands where the warm training worker would: no process, every rendezvous accepted.

    It never reports itself training (`GetCellStatus.training` stays false): the release comes
    from the trainer's membership, which the worker does not watch, so a later `StartTraining`
    must not wait for one."""

    async def start(self) -> None:
        return None

    async def train(self, rendezvous_uri: str, *, timeout_s: float = 10.0) -> None:
        self.sessions += 1

    async def stop(self) -> None:
        return None


def build_emulated_agent(settings: CellSettings) -> ServiceHost:
    """What `services.cell.main.build` wires, with the declining worker in place of the process."""
    agent = CellAgent(settings, EmulatedWorker(settings))
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
