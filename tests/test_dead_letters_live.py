"""`gyre dead-letters list | redrive` (real NATS and Postgres): a dead letter is listed with its
event, and a redriven one is handled once by the consumer that gave up on it, while a consumer
that had applied it finds it in its exactly-once record; a second redrive publishes nothing."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.inbox import Inbox
from gyre.db.tables import processed_messages_table
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent
from gyre.scheduler.v1 import events_pb2
from gyre.settings import KernelSettings
from gyre_app.dead_letters import list_dead_letters, redrive
from tests.test_bus import task_submitted

pytestmark = pytest.mark.asyncio(loop_scope="session")

SCHEMA = "dead_letters_test"
METADATA = sa.MetaData(schema=SCHEMA)
PROCESSED = processed_messages_table(METADATA)


@pytest_asyncio.fixture(loop_scope="session")
async def engine(kernel: KernelSettings) -> AsyncIterator[AsyncEngine]:
    assert kernel.database_url
    engine = make_engine(kernel.database_url)
    async with engine.begin() as conn:
        await conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        await conn.run_sync(METADATA.create_all)
    yield engine
    await engine.dispose()


async def until(predicate: object, what: str, *, within_s: float = 30.0) -> None:
    for _ in range(int(within_s / 0.1)):  # bounded
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"never: {what}")


async def run_gyre(env: dict[str, str], *argv: str) -> Any:
    """`gyre <argv> --json` as a user runs it (its own process: the command configures logging and
    runs its own event loop)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gyre_app.cli", *argv, "--json",
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out.decode().strip().splitlines()[-1])


async def test_a_redriven_dead_letter_is_handled_once(
    own_bus: Bus,
    engine: AsyncEngine,
    kernel: KernelSettings,
) -> None:
    env = {
        **os.environ,
        "GYRE_BUS_PREFIX": own_bus.prefix,
        "GYRE_NATS_URL": str(kernel.nats_url),
        "GYRE_DATABASE_URL": str(kernel.database_url),
    }
    applied: dict[str, list[str]] = {"refuser": [], "bystander": []}
    refuse = [True]

    def handler(name: str) -> object:
        async def handle(session: AsyncSession, event: DecodedEvent) -> None:
            if name == "refuser" and refuse[0]:
                raise InvalidArgument("task", "refused once, on purpose")  # dead-lettered at once
            applied[name].append(event.event_id)

        return handle

    sessions = make_sessionmaker(engine)
    consumers = {
        name: Consumer(
            own_bus,
            ConsumerSpec(
                durable=f"dl-{name}",
                producer="scheduler",
                inbox=Inbox(
                    sessions=sessions,
                    table=PROCESSED,
                    handlers={events_pb2.TaskSubmitted: handler(name)},  # type: ignore[dict-item]
                ),
            ),
        )
        for name in applied
    }
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in consumers.values()]
    try:
        envelope = task_submitted()
        await own_bus.publish(envelope)
        await until(lambda: consumers["refuser"].dead_lettered == 1, "the refuser gave up")
        await until(lambda: applied["bystander"] == [envelope.event_id], "the bystander applied it")

        listed = await run_gyre(env, "dead-letters", "list")
        [row] = listed["dead_letters"]
        assert (row["consumer"], row["event_id"]) == ("dl-refuser", envelope.event_id)
        assert row["event_type"] == "gyre.scheduler.v1.TaskSubmitted"
        assert "refused once, on purpose" in row["reason"] and row["dead_lettered_at"]
        rows = await list_dead_letters(own_bus.js, own_bus.prefix)

        refuse[0] = False
        redriven = await run_gyre(env, "dead-letters", "redrive", "--all")
        assert [r["published"] for r in redriven["redriven"]] == [True]
        await until(lambda: applied["refuser"] == [envelope.event_id], "the redriven event handled")
        # The bystander receives the copy too: its exactly-once record makes it a no-op.
        await until(lambda: consumers["bystander"].processed == 2, "the bystander acked the copy")
        assert applied["bystander"] == [envelope.event_id]

        assert (await run_gyre(env, "dead-letters", "list")) == {"dead_letters": []}
        [again] = await redrive(own_bus.js, own_bus.prefix, rows)  # a stale listing, redriven twice
        assert again["published"] is False
        await asyncio.sleep(1.0)  # a copy would be handled by now
        assert applied == {"refuser": [envelope.event_id], "bystander": [envelope.event_id]}
    finally:
        stop.set()
        await asyncio.gather(*tasks)
