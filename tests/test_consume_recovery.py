"""The consumer across crashes and outages (real NATS): a long handler keeps its message by
reporting progress, a consumer killed mid-handler has it redelivered after its short ack wait, and
a consumer that cannot create its stream or consumer yet (the server away) retries until it can."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer, ConsumerSpec
from gyre.devstack.embedded import start_nats, stop_nats_in
from gyre.events import DecodedEvent
from gyre.scheduler.v1 import events_pb2
from tests.test_bus import task_submitted

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def until(predicate: object, what: str, *, within_s: float = 30.0) -> None:
    for _ in range(int(within_s / 0.05)):  # bounded
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never: {what}")


def spec(durable: str, handler: object, **change: float) -> ConsumerSpec:
    return ConsumerSpec(
        durable=durable,
        producer="scheduler",
        handlers={events_pb2.TaskSubmitted: handler},  # type: ignore[dict-item]
        batch=1,
        **change,  # type: ignore[arg-type]
    )


async def test_a_long_handler_keeps_its_message_and_a_killed_one_is_redelivered(own_bus: Bus) -> None:
    calls: list[str] = []
    release = asyncio.Event()

    async def slow(event: DecodedEvent) -> None:
        calls.append(event.event_id)
        await release.wait()

    await own_bus.publish(task_submitted())
    # Two consumers on one durable: a message whose ack wait ran out would go to the idle one.
    short = {"ack_wait_s": 1.0, "progress_every_s": 0.2}
    first, second = (Consumer(own_bus, spec("progress-test", slow, **short)) for _ in range(2))
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in (first, second)]
    await until(lambda: calls, "the handler started")
    await asyncio.sleep(3.0)  # three ack waits: progress keeps the message with its handler
    assert len(calls) == 1
    release.set()
    await until(lambda: first.processed + second.processed == 1, "acked once")
    stop.set()
    await asyncio.gather(*tasks)

    # A consumer killed mid-handler: its message comes back after the ack wait, to the next one.
    await own_bus.publish(task_submitted(prompt="again"))
    release.clear()
    calls.clear()
    killed = asyncio.create_task(Consumer(own_bus, spec("progress-test", slow, **short)).run(asyncio.Event()))
    await until(lambda: calls, "the doomed handler started")
    killed.cancel()
    release.set()
    stop = asyncio.Event()
    successor = Consumer(own_bus, spec("progress-test", slow, **short))
    task = asyncio.create_task(successor.run(stop))
    await until(lambda: successor.processed == 1, "redelivered to the successor")
    assert calls[0] == calls[1]  # the same event, handled again
    stop.set()
    await task


@pytest_asyncio.fixture(loop_scope="session")
async def own_nats(tmp_path: Path) -> AsyncIterator[Path]:
    await asyncio.to_thread(start_nats, tmp_path / "nats")
    yield tmp_path / "nats"
    await asyncio.to_thread(stop_nats_in, tmp_path / "nats")


async def test_a_consumer_that_cannot_subscribe_yet_retries_until_the_server_is_back(own_nats: Path) -> None:
    server = await asyncio.to_thread(start_nats, own_nats)
    bus = await Bus.connect(BusConfig(url=server.url, prefix="retry"))
    seen: list[str] = []

    async def keep(event: DecodedEvent) -> None:
        seen.append(event.event_id)

    try:
        await asyncio.to_thread(stop_nats_in, own_nats)  # the server goes away before the consumer starts
        stop = asyncio.Event()
        consumer = Consumer(bus, spec("retry-test", keep, subscribe_retry_max_s=0.5))
        task = asyncio.create_task(consumer.run(stop))
        await asyncio.sleep(2.0)  # it fails to create the stream a few times meanwhile
        assert not task.done()
        again = await asyncio.to_thread(start_nats, own_nats)
        assert again.url == server.url  # the same port: the client reconnects by itself
        envelope = task_submitted()
        await until(lambda: bus.nc.is_connected, "reconnected")
        await bus.publish(envelope)
        await until(lambda: seen == [envelope.event_id], "the event handled once the server was back")
        stop.set()
        await task
    finally:
        await bus.close()
