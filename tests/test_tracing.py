"""Trace context travels with events (NATS headers, through the outbox) and RPCs (gRPC metadata).

Real NATS, real Postgres, a real gRPC server; only opentelemetry-api is configured (no exporter),
as in a default deployment.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import uuid
from pathlib import Path

import aiohttp
import grpc
import pytest
import sqlalchemy as sa
from nats.js.errors import NotFoundError
from opentelemetry import trace
from proxy_support import start_rig, write_tokenizer
from test_bus import run_until, task_submitted

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.db.engine import make_engine
from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent, parse_envelope
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.rpc import Context, GrpcServer
from gyre.rpc_telemetry import channel
from gyre.scheduler.v1 import events_pb2
from gyre.settings import KernelSettings
from gyre.tracing import TRACEPARENT, configure_tracing, continued_from, current_trace_id

# A trace a harness (or any caller) started: W3C traceparent, version 00, sampled.
CALLER_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER = {TRACEPARENT: f"00-{CALLER_TRACE_ID}-00f067aa0ba902b7-01"}


async def consume_trace_ids(bus: Bus, durable: str, expected: int) -> list[str]:
    """Run a consumer of TaskSubmitted until `expected` events arrived; the trace id each saw."""
    seen: list[str] = []

    async def handle(event: DecodedEvent) -> None:
        seen.append(current_trace_id())

    spec = ConsumerSpec(durable=durable, producer="scheduler", handlers={events_pb2.TaskSubmitted: handle})
    await run_until(Consumer(bus, spec), lambda: len(seen) >= expected)
    return seen


@pytest.mark.asyncio(loop_scope="session")
async def test_a_published_event_arrives_in_the_consumers_trace(own_bus: Bus) -> None:
    with continued_from(CALLER, "submit"):
        envelope = task_submitted()
    await own_bus.publish(envelope)
    assert await consume_trace_ids(own_bus, "trace-direct", 1) == [CALLER_TRACE_ID]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_trace_context_rides_in_the_nats_headers(own_bus: Bus) -> None:
    with continued_from(CALLER, "submit"):
        envelope = task_submitted()
    ack = await own_bus.publish(envelope)
    stored = await own_bus.js.get_msg(ack.stream, ack.seq)
    assert stored.headers is not None
    assert stored.headers[TRACEPARENT].split("-")[1] == CALLER_TRACE_ID


@pytest.mark.asyncio(loop_scope="session")
async def test_the_trace_survives_the_outbox(own_bus: Bus, kernel: KernelSettings) -> None:
    """Enqueued in the request's trace, published later by the relay's own task: same trace id."""
    assert kernel.database_url is not None
    engine = make_engine(kernel.database_url)
    metadata = sa.MetaData(schema="trace_test")
    outbox = sa.Table(
        "outbox",
        metadata,
        sa.Column("seq", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("event_id", sa.Uuid, nullable=False),
        sa.Column("event_type", sa.Text, nullable=False),
        sa.Column("envelope", sa.LargeBinary, nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True)),
    )
    try:
        async with engine.begin() as conn:
            await conn.execute(sa.text("CREATE SCHEMA IF NOT EXISTS trace_test"))
            await conn.run_sync(metadata.create_all)
        with continued_from(CALLER, "submit"):
            async with engine.begin() as conn:
                await enqueue(conn, outbox, task_submitted())  # type: ignore[arg-type]
        assert await OutboxRelay(engine, own_bus, outbox).publish_pending() == 1
        assert await consume_trace_ids(own_bus, "trace-outbox", 1) == [CALLER_TRACE_ID]
    finally:
        async with engine.begin() as conn:
            await conn.execute(sa.text("DROP SCHEMA trace_test CASCADE"))
        await engine.dispose()


@pytest.mark.asyncio(loop_scope="session")
async def test_an_event_published_outside_any_trace_starts_one_the_consumer_continues(own_bus: Bus) -> None:
    envelope = task_submitted()
    assert dict(envelope.trace_context) == {}
    await own_bus.publish(envelope)
    (seen,) = await consume_trace_ids(own_bus, "trace-root", 1)
    assert len(seen) == 32 and int(seen, 16) != 0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_grpc_call_carries_the_callers_trace_to_the_server() -> None:
    seen: list[str] = []

    async def whoami(request: bytes, context: Context) -> bytes:
        seen.append(current_trace_id())
        return b""

    server = GrpcServer(service_names=["test.Trace"])
    handler = grpc.unary_unary_rpc_method_handler(whoami, lambda b: b, lambda b: b)
    server.server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Trace", {"WhoAmI": handler}),)
    )
    await server.start()
    try:
        async with channel(server.address) as chan:
            call = chan.unary_unary("/test.Trace/WhoAmI", lambda b: b, lambda b: b)
            with continued_from(CALLER, "client"):
                await call(b"")
            await call(b"")  # outside any trace: the server starts its own
    finally:
        await server.stop(0)
    assert seen[0] == CALLER_TRACE_ID
    assert seen[1] not in ("", CALLER_TRACE_ID)


def test_a_hop_continues_the_trace_with_a_span_of_its_own_and_leaks_nothing() -> None:
    with continued_from(CALLER, "hop") as trace_id:
        span = trace.get_current_span().get_span_context()
    assert trace_id == format(span.trace_id, "032x") == CALLER_TRACE_ID
    assert format(span.span_id, "016x") != CALLER[TRACEPARENT].split("-")[2]
    assert current_trace_id() == ""


async def recorded_trace_ids(bus: Bus, execution_id: str) -> list[str]:
    """Trace ids in the NATS headers of the execution's LlmCallRecorded events, once one arrived."""
    subject = f"{bus.prefix}.proxy.v1.LlmCallRecorded"
    found: list[str] = []
    for _ in range(20):  # bounded: the recorder lingers and the relay polls
        try:
            sub = await bus.js.pull_subscribe(subject, durable=f"trace{uuid.uuid4().hex[:8]}")
        except NotFoundError:  # no stream until the proxy's first event
            await asyncio.sleep(0.5)
            continue
        try:
            for msg in await sub.fetch(256, timeout=0.5):
                event = proxy_events.LlmCallRecorded()
                parse_envelope(msg.data).payload.Unpack(event)
                if event.call.execution_id == execution_id:
                    found.append((msg.headers or {}).get(TRACEPARENT, "--").split("-")[1])
        except TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        if found:
            break
    return found


@pytest.mark.asyncio(loop_scope="session")
async def test_a_model_call_continues_the_harness_trace_into_its_recorded_event(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    rig = await start_rig(kernel, write_tokenizer(tmp_path / "model"), num_engines=1)
    try:
        token, execution_id = await rig.register_execution()
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                f"{rig.http_url}/v1/chat/completions",
                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
                headers={"Authorization": f"Bearer {token}", **CALLER},
            ) as answer,
        ):
            assert answer.status == 200, await answer.text()
        traces = await recorded_trace_ids(rig.bus, execution_id)
    finally:
        await rig.close()
    assert traces == [CALLER_TRACE_ID]


def test_the_console_exporter_records_a_hops_span_in_the_callers_trace() -> None:
    """With GYRE_TRACE_EXPORTER=console (and the SDK) a hop is a real span; run apart, since a
    tracer provider is set once per process."""
    script = (
        "from gyre.tracing import configure_tracing, continued_from\n"
        "from opentelemetry import trace\n"
        "configure_tracing('console')\n"
        f"with continued_from({CALLER!r}, 'consume TaskSubmitted'): pass\n"
        "trace.get_tracer_provider().shutdown()\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    span = json.loads(run.stdout)
    assert span["name"] == "consume TaskSubmitted"
    assert span["context"]["trace_id"] == f"0x{CALLER_TRACE_ID}"
    assert span["parent_id"] == "0x" + CALLER[TRACEPARENT].split("-")[2]


def test_an_unknown_exporter_is_refused_naming_the_choices() -> None:
    with pytest.raises(InvalidArgument, match="GYRE_TRACE_EXPORTER: expected none or console"):
        configure_tracing("zipkin")
