"""The kernel's one exactly-once path on real NATS and Postgres: the inbox consumer and the request log.

A scratch schema holds an effects table beside the kernel's `processed_messages` and
`rpc_requests`; handlers write effects, and the tests count what committed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.inbox import Inbox, after_commit, apply_batch
from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import processed_messages_table
from gyre.errors import Conflict, InvalidArgument
from gyre.events import DecodedEvent, new_event, subject_of, type_map, unpack_payload
from gyre.ids import new_uuid7
from gyre.scheduler.v1 import events_pb2, scheduler_pb2
from gyre.settings import KernelSettings
from gyre.settle import APPLIED, DUPLICATE, Fate

pytestmark = pytest.mark.asyncio(loop_scope="session")
SCHEMA = "exactly_once_test"


@dataclass
class Scratch:
    sessions: async_sessionmaker[AsyncSession]
    effects: sa.Table
    inbox_table: sa.Table
    requests: RequestLog

    async def count(self, table: sa.Table, **where: object) -> int:
        stmt = sa.select(sa.func.count()).select_from(table)
        for name, value in where.items():
            stmt = stmt.where(table.c[name] == value)
        async with self.sessions() as session:
            return int((await session.execute(stmt)).scalar_one())


@pytest_asyncio.fixture(loop_scope="session")
async def scratch(kernel: KernelSettings) -> AsyncIterator[Scratch]:
    assert kernel.database_url is not None
    engine = make_engine(kernel.database_url)
    metadata = sa.MetaData(schema=SCHEMA)
    effects = sa.Table("effects", metadata, sa.Column("task_id", sa.Text), sa.Column("note", sa.Text))
    inbox_table = processed_messages_table(metadata)
    requests = RequestLog(requests_table(metadata))
    async with engine.begin() as conn:
        await conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE"))
        await conn.execute(sa.text(f"CREATE SCHEMA {SCHEMA}"))
        await conn.run_sync(metadata.create_all)
    yield Scratch(make_sessionmaker(engine), effects, inbox_table, requests)
    async with engine.begin() as conn:
        await conn.execute(sa.text(f"DROP SCHEMA {SCHEMA} CASCADE"))
    await engine.dispose()


def submitted(note: str = "p") -> DecodedEvent:
    task_id = new_uuid7()
    task = scheduler_pb2.Task(task_id=task_id, spec=scheduler_pb2.TaskSpec(name="t", prompt=note))
    env = new_event(events_pb2.TaskSubmitted(task=task), producer="scheduler", correlation_id=task_id)
    decoded = unpack_payload(env, env.payload, type_map([events_pb2.TaskSubmitted]))
    assert decoded is not None
    return decoded


def inbox_of(scratch: Scratch, *, fail_on: str = "") -> Inbox:
    async def write(session: AsyncSession, event: DecodedEvent) -> None:
        task = event.payload.task
        await session.execute(sa.insert(scratch.effects).values(task_id=task.task_id, note=task.spec.prompt))
        if task.spec.prompt == fail_on:
            raise RuntimeError("the handler broke after writing")
        if task.spec.prompt == "invalid":
            raise InvalidArgument("task.spec.prompt", "is 'invalid'")

    return Inbox(
        sessions=scratch.sessions, table=scratch.inbox_table, handlers={events_pb2.TaskSubmitted: write}
    )


async def test_a_redelivered_event_is_applied_once(scratch: Scratch) -> None:
    event = submitted()
    inbox = inbox_of(scratch)
    # twice in one batch, then once more in a later batch (a redelivery after a lost ack)
    assert await apply_batch(inbox, "c", [event, event]) == [APPLIED, DUPLICATE]
    assert await apply_batch(inbox, "c", [event]) == [DUPLICATE]
    assert await scratch.count(scratch.effects, task_id=event.payload.task.task_id) == 1
    # another consumer of the same event applies it once too
    assert await apply_batch(inbox, "other", [event]) == [APPLIED]


async def test_a_handler_failure_rolls_back_its_effect_and_its_record_not_the_batch(scratch: Scratch) -> None:
    good, bad, wrong = submitted("good"), submitted("broken"), submitted("invalid")
    committed: list[str] = []

    async def remember(session: AsyncSession, event: DecodedEvent) -> None:
        await inbox_of(scratch, fail_on="broken").handlers[events_pb2.TaskSubmitted](session, event)
        after_commit(session, lambda: committed.append(event.payload.task.spec.prompt))

    inbox = Inbox(
        sessions=scratch.sessions, table=scratch.inbox_table, handlers={events_pb2.TaskSubmitted: remember}
    )
    outcomes = await apply_batch(inbox, "c", [good, bad, wrong])
    assert [o.fate for o in outcomes] == [Fate.APPLIED, Fate.FAILED, Fate.INVALID]
    assert outcomes[1].reason == "RuntimeError: the handler broke after writing"
    assert committed == ["good"], "hooks of rolled-back handlers never run"
    for event, effects, records in ((good, 1, 1), (bad, 0, 0), (wrong, 0, 0)):
        assert await scratch.count(scratch.effects, task_id=event.payload.task.task_id) == effects
        assert await scratch.count(scratch.inbox_table, event_id=uuid.UUID(event.event_id)) == records
    # the failed one is applied when it is retried and the handler works
    assert await apply_batch(inbox_of(scratch), "c", [bad]) == [APPLIED]
    assert await scratch.count(scratch.effects, task_id=bad.payload.task.task_id) == 1


async def test_a_failed_commit_leaves_nothing_and_retries_every_event(scratch: Scratch) -> None:
    first, second = submitted("a"), submitted("b")

    async def batch(session: AsyncSession, events: object) -> dict[str, object]:
        await session.execute(sa.insert(scratch.effects).values(task_id="batch", note="x"))
        await session.execute(sa.text("SELECT 1/0"))  # the statement fails: the transaction is lost
        return {}

    inbox = Inbox(
        sessions=scratch.sessions,
        table=scratch.inbox_table,
        batch=batch,  # type: ignore[arg-type]
        batch_types=(events_pb2.TaskSubmitted,),
    )
    outcomes = await apply_batch(inbox, "c", [first, second])
    assert {o.fate for o in outcomes} == {Fate.FAILED}
    assert await scratch.count(scratch.effects, task_id="batch") == 0
    assert await scratch.count(scratch.inbox_table, event_id=uuid.UUID(first.event_id)) == 0


async def test_the_consumer_applies_a_duplicate_published_event_once(own_bus: Bus, scratch: Scratch) -> None:
    event = submitted("via the bus")
    await own_bus.publish(event.envelope)
    # the same event under another message id: JetStream cannot dedupe it, the inbox must
    await own_bus.js.publish(
        subject_of(event.envelope, prefix=own_bus.prefix),
        event.envelope.SerializeToString(),
        headers={"Nats-Msg-Id": f"again-{event.event_id}"},
    )
    consumer = Consumer(
        own_bus, ConsumerSpec(durable="exactly", producer="scheduler", inbox=inbox_of(scratch))
    )
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    try:
        for _ in range(150):  # bounded: 15 s
            if consumer.processed >= 2:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.wait_for(running, timeout=10)
    assert consumer.processed >= 2
    assert await scratch.count(scratch.effects, task_id=event.payload.task.task_id) == 1


def cancel(request_id: str, reason: str = "r") -> scheduler_pb2.CancelTaskRequest:
    return scheduler_pb2.CancelTaskRequest(request_id=request_id, task_id=new_uuid7(), reason=reason)


async def test_a_replayed_request_id_gets_the_stored_answer_without_running_again(scratch: Scratch) -> None:
    runs: list[str] = []
    request = cancel(f"r-{new_uuid7()}")

    async def act(session: AsyncSession) -> scheduler_pb2.CancelTaskResponse:
        runs.append(request.request_id)
        await session.execute(sa.insert(scratch.effects).values(task_id=request.task_id, note="cancelled"))
        return scheduler_pb2.CancelTaskResponse(num_executions_stopped=len(runs))

    kwargs = {"method": "CancelTask", "request": request, "cls": scheduler_pb2.CancelTaskResponse, "act": act}
    first, fresh = await scratch.requests.answer_once(scratch.sessions, **kwargs)  # type: ignore[arg-type]
    again, repeat_fresh = await scratch.requests.answer_once(scratch.sessions, **kwargs)  # type: ignore[arg-type]
    assert (fresh, repeat_fresh) == (True, False)
    assert again == first and first.num_executions_stopped == 1 and len(runs) == 1
    assert await scratch.count(scratch.effects, task_id=request.task_id) == 1
    # the id with another body, or for another method, is refused
    other = scheduler_pb2.CancelTaskRequest()
    other.CopyFrom(request)
    other.reason = "another"
    with pytest.raises(Conflict, match="already used for a different request"):
        await scratch.requests.answer_once(scratch.sessions, **{**kwargs, "request": other})  # type: ignore[arg-type]
    with pytest.raises(Conflict):
        await scratch.requests.answer_once(scratch.sessions, **{**kwargs, "method": "SetMode"})  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="request_id"):
        await scratch.requests.answer_once(scratch.sessions, **{**kwargs, "request": cancel("")})  # type: ignore[arg-type]


async def test_concurrent_calls_with_one_request_id_run_the_work_once(scratch: Scratch) -> None:
    request = cancel(f"c-{new_uuid7()}")
    gate = asyncio.Event()
    runs: list[int] = []

    async def act(session: AsyncSession) -> scheduler_pb2.CancelTaskResponse:
        runs.append(len(runs))
        await session.execute(sa.insert(scratch.effects).values(task_id=request.task_id, note=str(len(runs))))
        if len(runs) == 1:
            await gate.wait()  # the first holds its claim open until the second has started
        return scheduler_pb2.CancelTaskResponse(num_executions_stopped=len(runs))

    async def call() -> scheduler_pb2.CancelTaskResponse:
        answer, _ = await scratch.requests.answer_once(
            scratch.sessions,
            method="CancelTask",
            request=request,
            cls=scheduler_pb2.CancelTaskResponse,
            act=act,
        )
        return answer

    first = asyncio.create_task(call())
    for _ in range(100):  # bounded: until the first is inside its transaction
        if runs:
            break
        await asyncio.sleep(0.01)
    second = asyncio.create_task(call())
    await asyncio.sleep(0.2)
    gate.set()
    a, b = await asyncio.gather(first, second)
    assert a == b
    assert await scratch.count(scratch.effects, task_id=request.task_id) == 1, (
        "the loser's writes rolled back"
    )


async def test_work_after_the_commit_that_fails_leaves_the_event_applied(scratch: Scratch) -> None:
    event = submitted("hooked")
    ran: list[str] = []

    async def write_then_hooks(session: AsyncSession, event: DecodedEvent) -> None:
        await inbox_of(scratch).handlers[events_pb2.TaskSubmitted](session, event)
        after_commit(session, lambda: 1 / 0)  # e.g. a process that could not start
        after_commit(session, lambda: ran.append("next"))

    inbox = Inbox(
        sessions=scratch.sessions,
        table=scratch.inbox_table,
        handlers={events_pb2.TaskSubmitted: write_then_hooks},
    )
    assert await apply_batch(inbox, "c", [event]) == [APPLIED]
    assert ran == ["next"]
    assert await scratch.count(scratch.effects, task_id=event.payload.task.task_id) == 1
