"""Outages are waits (real NATS, a private Postgres this module starts and stops): a consumer
whose database goes away holds its events and applies them once it is back, however short its
retry limits, and a group whose rewards land during a 25 s database outage (longer than the
15 s after which a consumer used to dead-letter them) is trained once after it."""

from __future__ import annotations

import asyncio
import json
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from bench.fault_outages import postgres_away_while_rewards_land
from bench.fault_stack import Stack
from bench.faults import settle
from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer, ConsumerSpec
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.inbox import Inbox
from gyre.db.tables import processed_messages_table
from gyre.devstack.embedded import start_postgres, stop_postgres
from gyre.devstack.scratch import scratch_kernel
from gyre.events import DecodedEvent
from gyre.scheduler.v1 import events_pb2
from tests.test_bus import task_submitted

pytestmark = pytest.mark.asyncio(loop_scope="session")

METADATA = sa.MetaData()
PROCESSED = processed_messages_table(METADATA)
SEEN = sa.Table("seen_tasks", METADATA, sa.Column("event_id", sa.Text, primary_key=True))


@pytest_asyncio.fixture(loop_scope="session")
async def private_postgres() -> AsyncIterator[tuple[Path, str]]:
    """(data folder, admin URL) of a Postgres only this test stops and starts."""
    with tempfile.TemporaryDirectory(prefix="gyre-outage-pg-") as folder:
        data = Path(folder) / "pg"
        server = await asyncio.to_thread(start_postgres, data)
        try:
            yield data, server.url
        finally:
            await asyncio.to_thread(stop_postgres, data)


async def until(predicate: object, what: str, *, within_s: float) -> None:
    for _ in range(int(within_s / 0.1)):  # bounded
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


async def test_a_consumer_holds_its_events_through_a_database_outage_longer_than_its_retries(
    private_postgres: tuple[Path, str], server_urls: tuple[str, str]
) -> None:
    data, url = private_postgres
    engine = make_engine(url)
    async with engine.begin() as conn:
        await conn.run_sync(METADATA.create_all)
    sessions = make_sessionmaker(engine)

    async def record(session: AsyncSession, event: DecodedEvent) -> None:
        await session.execute(sa.insert(SEEN).values(event_id=event.event_id))

    # Retries this short gave up (dead-lettered) within about a second of handler failures.
    spec = ConsumerSpec(
        durable="outage-test",
        producer="scheduler",
        inbox=Inbox(sessions=sessions, table=PROCESSED, handlers={events_pb2.TaskSubmitted: record}),
        max_deliver=3,
        retry_base_s=0.1,
        probe_max_s=0.5,
    )
    bus = await Bus.connect(BusConfig(url=server_urls[0], prefix=f"o{uuid.uuid4().hex[:8]}"))
    consumer = Consumer(bus, spec)
    stop = asyncio.Event()
    task = asyncio.create_task(consumer.run(stop))
    try:
        first = task_submitted()
        await bus.publish(first)
        await until(lambda: consumer.processed == 1, "the first event handled", within_s=30)

        await asyncio.to_thread(stop_postgres, data)
        held = [task_submitted(prompt=f"held {i}") for i in range(3)]
        for envelope in held:
            await bus.publish(envelope)
        await asyncio.sleep(5.0)  # many times the retries that used to be allowed
        assert consumer.outages_waited >= 1
        await asyncio.to_thread(start_postgres, data)

        await until(lambda: consumer.processed == 4, "the held events handled", within_s=60)
        assert consumer.dead_lettered == 0
        async with sessions() as session:
            seen = set((await session.execute(sa.select(SEEN.c.event_id))).scalars())
        assert seen == {e.event_id for e in [first, *held]}
    finally:
        stop.set()
        await task
        await bus.close()
        await engine.dispose()


@pytest.mark.slow
@pytest.mark.e2e
async def test_a_group_whose_rewards_land_during_a_25s_database_outage_is_trained_once(
    private_postgres: tuple[Path, str], server_urls: tuple[str, str]
) -> None:
    data, admin_url = private_postgres
    with tempfile.TemporaryDirectory(prefix="gyre-outage-") as work:
        async with scratch_kernel(server_urls[0], admin_url, label="outage") as kernel:
            stack = Stack(kernel, Path(work))
            try:
                await stack.start()
                executions, tasks = await postgres_away_while_rewards_land(stack, data, outage_s=25.0)
                outcome = await settle(stack, executions, tasks)
            finally:
                await stack.close()
    problems = {k: getattr(outcome, k) for k in ("lost_calls", "duplicate_trained_groups", "unrecovered")}
    assert problems == {k: 0 for k in problems}, json.dumps(problems)
