"""Log lines carry the task, execution and call ids of the request or event they are about."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import structlog
from test_bus import run_until, task_submitted

from gyre.bus import Bus
from gyre.common.v1 import ids_pb2
from gyre.consume import Consumer, ConsumerSpec
from gyre.events import DecodedEvent
from gyre.logs import bind_ids
from gyre.scheduler.v1 import events_pb2
from gyre.trajectory.v1 import trajectory_pb2


@pytest.fixture(autouse=True)
def clean_context() -> Iterator[None]:
    structlog.contextvars.clear_contextvars()
    yield
    structlog.contextvars.clear_contextvars()


def test_ids_in_an_execution_ref_are_bound() -> None:
    bind_ids(
        events_pb2.ExecutionScheduled(
            execution=ids_pb2.ExecutionRef(task_id="t1", execution_id="e1"), prompt="not an id"
        )
    )
    assert structlog.contextvars.get_contextvars() == {"task_id": "t1", "execution_id": "e1"}


def test_a_top_level_call_id_is_bound() -> None:
    bind_ids(trajectory_pb2.GetCallRequest(call_id="c7"))
    assert structlog.contextvars.get_contextvars() == {"call_id": "c7"}


@pytest.mark.asyncio(loop_scope="session")
async def test_a_consumer_handles_an_event_with_its_ids_and_trace_bound(own_bus: Bus) -> None:
    envelope = task_submitted()
    await own_bus.publish(envelope)
    seen: list[dict[str, object]] = []

    async def handle(event: DecodedEvent) -> None:
        seen.append(structlog.contextvars.get_contextvars())

    spec = ConsumerSpec(durable="logs", producer="scheduler", handlers={events_pb2.TaskSubmitted: handle})
    await run_until(Consumer(own_bus, spec), lambda: bool(seen))
    bound = seen[0]
    assert bound["task_id"] == envelope.correlation_id
    assert bound["event_id"] == envelope.event_id
    assert len(str(bound["trace_id"])) == 32
