"""The JetStream bus on a real server: dedupe, idempotent redelivery, dead letters, large payloads."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import pytest_asyncio
import sqlalchemy as sa

from gyre.bus import Bus, BusConfig, dead_letter_subject
from gyre.common.v1 import envelope_pb2
from gyre.consume import Consumer, ConsumerSpec
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.inbox import apply_batch
from gyre.events import DecodedEvent, new_event, stream_name, subject_of, type_map, unpack_payload
from gyre.ids import new_uuid7
from gyre.scheduler.v1 import events_pb2, scheduler_pb2
from gyre.settings import KernelSettings
from gyre.settle import APPLIED, Outcome
from gyre_app.migrations import upgrade
from services.trajectory import repo
from services.trajectory.consumer import TaskEvents

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def bus(kernel: KernelSettings, bus_prefix: str) -> AsyncIterator[Bus]:
    assert kernel.nats_url is not None
    # A prefix of this module's own: nothing else consumes these streams.
    b = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=f"{bus_prefix}bus"))
    yield b
    await b.close()


@pytest_asyncio.fixture(loop_scope="session")
async def task_events(kernel: KernelSettings) -> AsyncIterator[TaskEvents]:
    assert kernel.database_url is not None
    await asyncio.to_thread(upgrade, "trajectory", kernel.database_url)
    engine = make_engine(kernel.database_url)
    yield TaskEvents(make_sessionmaker(engine))
    await engine.dispose()


def task_submitted(group_size: int = 2, prompt: str = "p") -> envelope_pb2.Envelope:
    task_id = new_uuid7()
    task = scheduler_pb2.Task(
        task_id=task_id,
        spec=scheduler_pb2.TaskSpec(
            name="t", family="math", prompt=prompt, group_size=group_size, timeout_s=1, harness="h"
        ),
    )
    for i in range(group_size):
        task.executions.add(task_id=task_id, execution_id=new_uuid7(), index_in_group=i)
    return new_event(events_pb2.TaskSubmitted(task=task), producer="scheduler", correlation_id=task_id)


async def run_until(consumer: Consumer, done: Callable[[], Awaitable[bool]] | Callable[[], bool]) -> None:
    stop = asyncio.Event()
    runner = asyncio.create_task(consumer.run(stop))
    try:
        for _ in range(150):  # bounded: 15 s
            result = done()
            if (await result) if asyncio.iscoroutine(result) else result:
                return
            if runner.done():
                runner.result()
            await asyncio.sleep(0.1)
        raise AssertionError("consumer did not get there in time")
    finally:
        stop.set()
        await asyncio.wait_for(runner, timeout=10)


async def count(sessions_owner: TaskEvents, stmt: sa.Select[tuple[int]]) -> int:
    async with sessions_owner.sessions() as session:
        return int((await session.execute(stmt)).scalar_one())


async def test_publishing_an_event_twice_stores_it_once(bus: Bus) -> None:
    env = task_submitted()
    first = await bus.publish(env)
    second = await bus.publish(env)
    assert not first.duplicate and second.duplicate
    assert second.seq == first.seq


async def test_a_redelivered_duplicate_changes_nothing(bus: Bus, task_events: TaskEvents) -> None:
    env = task_submitted(group_size=3)
    task_id = env.payload
    await bus.publish(env)
    # The same event again under another message id: JetStream cannot dedupe it, the inbox must.
    await bus.js.publish(
        subject_of(env, prefix=bus.prefix), env.SerializeToString(), headers={"Nats-Msg-Id": "again"}
    )
    consumer = Consumer(bus, TaskEvents(task_events.sessions).spec())
    await run_until(consumer, lambda: consumer.processed >= 2)
    decoded = events_pb2.TaskSubmitted()
    task_id.Unpack(decoded)
    members = (
        sa.select(sa.func.count())
        .select_from(repo.group_executions)
        .where(repo.group_executions.c.task_id == decoded.task.task_id)
    )
    assert await count(task_events, members) == 3
    claimed = (
        sa.select(sa.func.count())
        .select_from(repo.processed_messages)
        .where(repo.processed_messages.c.event_id == env.event_id)
    )
    assert await count(task_events, claimed) == 1


async def read_dead_letters(bus: Bus, consumer: str) -> list[envelope_pb2.DeadLetter]:
    sub = await bus.js.pull_subscribe(
        dead_letter_subject(consumer, prefix=bus.prefix), stream=stream_name("deadletter", prefix=bus.prefix)
    )
    letters = []
    for _ in range(5):  # bounded; a loaded machine can miss one short fetch window
        try:
            for msg in await sub.fetch(10, timeout=2):
                letters.append(envelope_pb2.DeadLetter.FromString(msg.data))
                await msg.ack()
        except TimeoutError:
            pass
        if letters:
            break
    await sub.unsubscribe()
    return letters


async def test_an_undecodable_message_is_dead_lettered_and_the_consumer_goes_on(
    bus: Bus, task_events: TaskEvents
) -> None:
    subject = f"{bus.prefix}.scheduler.v1.TaskSubmitted"
    await bus.ensure_stream("scheduler")
    await bus.js.publish(subject, b"\x0a\xff\xff garbage", headers={"Nats-Msg-Id": "garbage-1"})
    good = task_submitted()
    await bus.publish(good)
    spec = TaskEvents(task_events.sessions).spec()
    consumer = Consumer(bus, ConsumerSpec(durable="deadletter-test", producer="scheduler", inbox=spec.inbox))
    await run_until(consumer, lambda: consumer.dead_lettered == 1 and consumer.processed >= 1)
    letters = await read_dead_letters(bus, "deadletter-test")
    assert len(letters) == 1
    assert letters[0].reason.startswith("undecodable: envelope is not a gyre.common.v1.Envelope")
    assert letters[0].data == b"\x0a\xff\xff garbage"
    assert letters[0].msg_id == "garbage-1" and letters[0].subject == subject


async def test_a_handler_that_keeps_failing_is_retried_then_dead_lettered(bus: Bus) -> None:
    attempts: list[str] = []

    async def broken(event: DecodedEvent) -> None:
        attempts.append(event.event_id)
        raise RuntimeError("database constraint broke")

    env = task_submitted()
    await bus.publish(env)
    consumer = Consumer(
        bus,
        ConsumerSpec(
            durable="retry-test",
            producer="scheduler",
            handlers={events_pb2.TaskSubmitted: broken},
            max_deliver=3,
            retry_base_s=0.05,
        ),
    )
    # Earlier tests' events in this session's stream fail and are dead-lettered too: wait for ours.
    parked: list[str] = []
    real_dead_letter = bus.dead_letter

    async def spy(msg: Any, *, consumer: str, reason: str) -> None:
        await real_dead_letter(msg, consumer=consumer, reason=reason)
        parked.append((msg.headers or {}).get("Nats-Msg-Id", ""))

    bus.dead_letter = spy  # type: ignore[method-assign]
    await run_until(consumer, lambda: env.event_id in parked)
    assert attempts.count(env.event_id) == 3
    letters = [x for x in await read_dead_letters(bus, "retry-test") if env.event_id in x.msg_id]
    assert len(letters) == 1
    assert letters[0].reason == "handler failed 3 times: RuntimeError: database constraint broke"


async def test_a_payload_over_the_message_limit_travels_through_the_object_store(
    kernel: KernelSettings, bus: Bus
) -> None:
    big_prompt = "x" * (3 * bus.nc.max_payload)  # far over what one NATS message may carry
    env = task_submitted(prompt=big_prompt)
    await bus.publish(env)
    raw = await bus.js.get_last_msg(
        stream_name("scheduler", prefix=bus.prefix), subject_of(env, prefix=bus.prefix)
    )
    stored = envelope_pb2.Envelope.FromString(raw.data or b"")
    assert stored.WhichOneof("body") == "payload_ref" and len(raw.data or b"") < 4096

    received: list[events_pb2.TaskSubmitted] = []

    async def keep(event: DecodedEvent) -> None:
        received.append(event.payload)

    consumer = Consumer(
        bus,
        ConsumerSpec(durable="large-test", producer="scheduler", handlers={events_pb2.TaskSubmitted: keep}),
    )
    await run_until(consumer, lambda: any(r.task.spec.prompt == big_prompt for r in received))


async def test_an_event_that_decodes_but_is_invalid_is_dead_lettered_without_retries(
    bus: Bus, task_events: TaskEvents
) -> None:
    bad = new_event(
        events_pb2.TaskSubmitted(task=scheduler_pb2.Task(task_id="not-a-uuid")),
        producer="scheduler",
        correlation_id="x",
    )
    await bus.publish(bad)
    spec = TaskEvents(task_events.sessions).spec()
    consumer = Consumer(bus, ConsumerSpec(durable="invalid-test", producer="scheduler", inbox=spec.inbox))
    await run_until(consumer, lambda: consumer.dead_lettered >= 1)
    letters = [x for x in await read_dead_letters(bus, "invalid-test") if x.msg_id == bad.event_id]
    assert len(letters) == 1 and letters[0].num_delivered == 1
    assert letters[0].reason == "invalid event: task.task_id: must be a task id (UUID), got 'not-a-uuid'"


async def test_a_jetstream_redelivery_after_a_lost_ack_is_a_no_op(bus: Bus, task_events: TaskEvents) -> None:
    """The batch commits, then the ack is lost: JetStream delivers the event again."""
    env = task_submitted(group_size=2)
    await bus.publish(env)
    spec = TaskEvents(task_events.sessions).spec()
    assert spec.inbox is not None
    decoded_event = unpack_payload(env, env.payload, type_map(spec.event_types))
    assert decoded_event is not None
    # the first delivery's work, committed; its ack never reached the server
    assert await apply_batch(spec.inbox, "redelivery-test", [decoded_event]) == [APPLIED]
    deliveries: list[str] = []
    consumer = Consumer(bus, ConsumerSpec(durable="redelivery-test", producer="scheduler", inbox=spec.inbox))
    real_settle = consumer._settle

    async def spy(msg: Any, outcome: Outcome, event: DecodedEvent | None = None) -> str:
        if event is not None and event.event_id == env.event_id:
            deliveries.append(outcome.fate.value)
        return await real_settle(msg, outcome, event)

    consumer._settle = spy  # type: ignore[method-assign]
    await run_until(consumer, lambda: bool(deliveries))
    decoded = events_pb2.TaskSubmitted()
    env.payload.Unpack(decoded)
    members = (
        sa.select(sa.func.count())
        .select_from(repo.group_executions)
        .where(repo.group_executions.c.task_id == decoded.task.task_id)
    )
    assert await count(task_events, members) == 2
    assert deliveries == ["duplicate"]
