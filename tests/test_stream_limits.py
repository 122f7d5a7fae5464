"""Every JetStream stream and the payload bucket have retention limits (Postgres is the durable record)."""

from __future__ import annotations

import uuid

import pytest
from nats.js.api import StreamConfig

from gyre.bus import Bus, BusConfig
from gyre.events import new_event, stream_name
from gyre.scheduler.v1 import events_pb2, scheduler_pb2
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def connect(kernel: KernelSettings, prefix: str, **limits: float) -> Bus:
    assert kernel.nats_url
    return await Bus.connect(BusConfig(url=kernel.nats_url, prefix=prefix, **limits))  # type: ignore[arg-type]


async def test_a_new_stream_keeps_events_a_bounded_time_and_size(kernel: KernelSettings) -> None:
    bus = await connect(
        kernel, f"{kernel.bus_prefix}l{uuid.uuid4().hex[:6]}", max_age_s=3600, max_bytes=10**7
    )
    try:
        info = await bus.js.stream_info(await bus.ensure_stream("scheduler"))
    finally:
        await bus.close()
    assert (info.config.max_age, info.config.max_bytes) == (3600, 10**7)
    assert info.config.duplicate_window == 3600  # never longer than what the stream keeps


async def test_a_stream_made_without_limits_gets_them(kernel: KernelSettings) -> None:
    prefix = f"{kernel.bus_prefix}l{uuid.uuid4().hex[:6]}"
    bus = await connect(kernel, prefix)
    try:
        name = stream_name("proxy", prefix=prefix)
        await bus.js.add_stream(StreamConfig(name=name, subjects=[f"{prefix}.proxy.>"]))  # an older Gyre
        info = await bus.js.stream_info(await bus.ensure_stream("proxy"))
    finally:
        await bus.close()
    assert info.config.max_age == 7 * 24 * 3600


async def test_the_payload_bucket_expires_what_it_holds(kernel: KernelSettings) -> None:
    prefix = f"{kernel.bus_prefix}l{uuid.uuid4().hex[:6]}"
    bus = await connect(kernel, prefix, max_age_s=3600)
    bus.inline_limit_bytes = 16  # every payload goes through the bucket
    submitted = events_pb2.TaskSubmitted(
        task=scheduler_pb2.Task(task_id="t", spec=scheduler_pb2.TaskSpec(prompt="x" * 100))
    )
    try:
        await bus.publish(new_event(submitted, producer="scheduler", correlation_id="c"))
        info = await bus.js.stream_info(f"OBJ_{bus.payload_bucket}")
    finally:
        await bus.close()
    assert info.config.max_age == 3600
