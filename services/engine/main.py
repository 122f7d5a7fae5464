"""Engine process wiring (shell, no logic)."""

from __future__ import annotations

import asyncio

import torch

from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings, resolve_nats_url
from services.engine import metrics
from services.engine.config import EngineSettings
from services.engine.events import EnginePublisher
from services.engine.follow import WeightsEvents
from services.engine.port import EngineBackend
from services.engine.service import EngineServicer

NAME = "engine"


def build_backend(settings: EngineSettings, publisher: EnginePublisher | None = None) -> EngineBackend:
    """Load the model and wrap it in the chosen adapter (blocking: call it off the event loop)."""
    if settings.init_model_if_missing and not (settings.model_dir / "config.json").exists():
        from services.engine.model_init import init_model

        init_model(settings.model_dir)
    if settings.adapter == "vllm":
        from services.engine.vllm_engine import VllmEngine

        return VllmEngine(settings)
    from services.engine.loop import EngineLoop
    from services.engine.torch_engine import TorchEngine

    core = TorchEngine(
        settings.model_dir,
        engine_id=settings.engine_id,
        policy_version=settings.policy_version,
        max_batch=settings.max_batch,
        prefill_chunk_tokens=settings.prefill_chunk_tokens,
        prefix_cache_max_tokens=settings.prefix_cache_max_tokens,
    )
    return EngineLoop(
        core,
        cell_id=settings.cell_id,
        paused_ttl_s=settings.paused_ttl_s,
        on_drained=publisher.drained if publisher else None,
        on_weights=publisher.weights_updated if publisher else None,
    )


async def build(settings: EngineSettings, kernel: KernelSettings) -> ServiceHost:
    torch.set_num_threads(settings.num_threads)
    bus = None
    if settings.publish_events or settings.follow_weights:
        # The bus alone (the engine owns no tables), with its password file where one is named.
        config = BusConfig(
            url=resolve_nats_url(kernel),
            prefix=kernel.bus_prefix,
            max_age_s=kernel.stream_max_age_s,
            max_bytes=kernel.stream_max_bytes,
        )
        bus = await Bus.connect(config, name="gyre-engine")
    publisher = EnginePublisher(
        bus if settings.publish_events else None, engine_id=settings.engine_id, cell_id=settings.cell_id
    )
    backend = await asyncio.to_thread(build_backend, settings, publisher)
    metrics.register(backend, engine_id=settings.engine_id, cell_id=settings.cell_id)
    server = GrpcServer(
        service_names=[engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    engine_pb2_grpc.add_EngineServiceServicer_to_server(EngineServicer(backend), server.server)

    followers = []
    if settings.follow_weights and bus is not None:
        weights = WeightsEvents(backend, engine_id=settings.engine_id)
        await weights.catch_up(bus)  # before serving: a restarted engine must not serve old weights
        followers.append(Consumer(bus, weights.spec()))

    async def run_engine(stop: asyncio.Event) -> None:
        # One worker, so the bus closes only after the decode loop and the consumer are both done.
        try:
            await asyncio.gather(backend.run(stop), *(f.run(stop) for f in followers))
        finally:
            if bus is not None:
                await bus.close()

    return ServiceHost(name=NAME, server=server, connections=None, workers=[run_engine])
