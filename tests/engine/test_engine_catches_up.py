"""A restarted engine serves the latest published weights from its first call, not its initial ones."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gyre.bus import Bus, BusConfig
from gyre.events import new_event
from gyre.settings import KernelSettings
from tests.engine.conftest import engine_settings, start_engine
from tests.engine.test_engine_follows_trainer import engine_version, published_v1, weights_published
from tests.engine.test_engine_grpc import stub


async def test_an_engine_restarted_after_a_step_starts_on_that_steps_weights(
    model_dir: Path, tmp_path: Path, kernel: KernelSettings
) -> None:
    v1 = published_v1(model_dir, tmp_path)
    own = KernelSettings(nats_url=kernel.nats_url, bus_prefix=f"{kernel.bus_prefix}-catchup")
    bus = await Bus.connect(BusConfig(url=str(own.nats_url), prefix=own.bus_prefix))
    settings = engine_settings(model_dir, "restarted", follow_weights=True)
    try:
        host = await start_engine(settings, own)
        ch, api = stub(host)
        async with ch:
            await bus.publish(
                new_event(
                    weights_published(1, v1.source_uri, v1.sha256),
                    producer="trainer",
                    correlation_id="step-1",
                )
            )
            for _ in range(100):  # bounded: 20 s for the running engine to follow
                if await engine_version(api) == 1:
                    break
                await asyncio.sleep(0.2)
        await host.stop(0.5)
        # Same engine id, same durable consumer: version 1 is acked already and will not come again.
        host = await start_engine(settings, own)
        ch, api = stub(host)
        async with ch:
            assert await engine_version(api) == 1  # the first answer after the restart
        await host.stop(0.5)
    finally:
        await bus.close()
