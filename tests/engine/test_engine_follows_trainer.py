"""The engine applies the trainer's `WeightsPublished` by itself, once, through the UpdateWeights path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from gyre.bus import Bus, BusConfig
from gyre.common.v1 import ids_pb2
from gyre.engine.v1 import engine_pb2 as pb
from gyre.events import new_event
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from services.trainer.weights import PublishedWeights, publish
from tests.engine.conftest import engine_settings, start_engine
from tests.engine.test_engine_grpc import PROMPT, greedy, read_all, stub


def weights_published(version: int, source_uri: str, sha256: str) -> trainer_events.WeightsPublished:
    return trainer_events.WeightsPublished(
        version=ids_pb2.PolicyVersion(steps=version), source_uri=source_uri, sha256=sha256, size_bytes=1
    )


async def engine_version(api: object) -> int:
    stats = await api.GetEngineStats(pb.GetEngineStatsRequest())  # type: ignore[attr-defined]
    return int(stats.policy_version.steps)


def published_v1(model_dir: Path, tmp_path: Path) -> PublishedWeights:
    """Version 1 as the trainer writes it: a save_pretrained folder, its sha256 for the event."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return publish(model, tmp_path / "weights", version=1)


async def test_published_weights_are_loaded_once_and_bad_ones_leave_it_serving(
    model_dir: Path, tmp_path: Path, kernel: KernelSettings
) -> None:
    v1 = published_v1(model_dir, tmp_path)
    own = KernelSettings(nats_url=kernel.nats_url, bus_prefix=f"{kernel.bus_prefix}-follow")
    bus = await Bus.connect(BusConfig(url=str(own.nats_url), prefix=own.bus_prefix))
    host = await start_engine(engine_settings(model_dir, "follower", follow_weights=True), own)
    ch, api = stub(host)
    try:
        async with ch:
            for event in (
                weights_published(0, f"file://{model_dir}", ""),  # what it serves already
                weights_published(1, v1.source_uri, v1.sha256),
                weights_published(1, v1.source_uri, v1.sha256),  # a repeat: nothing to do
                weights_published(2, v1.source_uri, "0" * 64),  # wrong hash: refused, dead-lettered
            ):
                await bus.publish(new_event(event, producer="trainer", correlation_id="step"))
            for _ in range(100):  # bounded: 20 s
                if await engine_version(api) == 1:
                    break
                await asyncio.sleep(0.2)
            await asyncio.sleep(1.0)  # the refused v2 has been seen by now (one fetch per event)
            assert await engine_version(api) == 1
            _, versions, _ = await read_all(
                api.GenerateTokens(
                    pb.GenerateTokensRequest(request_id="after", prompt_ids=PROMPT, sampling=greedy(4))
                )
            )
    finally:
        await host.stop(0.5)
        await bus.close()
    assert versions == [1, 1, 1, 1]
