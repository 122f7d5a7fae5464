"""Evaluator process wiring (shell, no logic)."""

from __future__ import annotations

from pathlib import Path

from gyre.consume import Consumer
from gyre.db.outbox import OutboxRelay
from gyre.evaluator.v1 import evaluator_pb2, evaluator_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, connect
from gyre.sandbox.host import SandboxHost
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.settings import KernelSettings
from services.evaluator import metrics, repo
from services.evaluator.config import EvaluatorSettings
from services.evaluator.consumer import RunnerEvents
from services.evaluator.grading import Grader
from services.evaluator.service import EvaluatorServicer

NAME = "evaluator"
MIGRATIONS = Path(__file__).with_name("migrations")


async def build(settings: EvaluatorSettings, kernel: KernelSettings) -> ServiceHost:
    sandboxes = SandboxHost(
        settings.sandbox_root,
        mode=settings.sandbox_mode,
        uid_base=settings.uid_base,
    )
    sandboxes.sweep()  # a killed evaluator's grading sandboxes: its unacked grades come back anyway
    grader = Grader(sandboxes, settings.limits(), **settings.grader_bounds())
    engine = find_engine()
    grader.containers = settings.container_grader(OciBackend(engine)) if engine else None
    if grader.containers is not None:  # a killed evaluator's grading containers: redelivered anyway
        await grader.containers.backend.sweep(grader.containers.owner)
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox)
    metrics.register()
    runner = Consumer(conns.bus, RunnerEvents(conns.sessions, relay, grader, settings).spec())
    server = GrpcServer(
        service_names=[evaluator_pb2.DESCRIPTOR.services_by_name["EvaluatorService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    evaluator_pb2_grpc.add_EvaluatorServiceServicer_to_server(
        EvaluatorServicer(conns.sessions, relay, grader, settings), server.server
    )
    return ServiceHost(name=NAME, server=server, connections=conns, workers=[relay.run, runner.run])
