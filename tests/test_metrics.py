"""Prometheus metrics: a real service process serves them; consumers, gauges and event observers feed them."""

from __future__ import annotations

import asyncio
import os
import sys
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from test_bus import run_until, task_submitted

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.devstack.embedded import free_port
from gyre.devstack.processes import is_our_process, spawn_detached, terminate
from gyre.devstack.scratch import scratch_kernel
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent
from gyre.healthcheck import check
from gyre.metrics import observe_published, register_gauge, serve_metrics
from gyre.scheduler.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
GET_TASK = "/gyre.scheduler.v1.SchedulerService/GetTask"
SUBMIT_TASKS = "/gyre.scheduler.v1.SchedulerService/SubmitTasks"
TASK_SUBMITTED = "gyre.scheduler.v1.TaskSubmitted"


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def sample(scraped: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return scraped.get((name, frozenset(labels.items())), 0.0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def scheduler_process(
    server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[tuple[str, str]]:
    """`python -m services.scheduler` with GYRE_METRICS_PORT, on a database and prefix of its own:
    its gRPC address and metrics URL."""
    port, metrics_port = free_port(), free_port()
    log_path = tmp_path_factory.mktemp("scheduler") / "scheduler.log"
    async with scratch_kernel(*server_urls, label="metrics") as kernel:
        env = {
            **os.environ,
            "GYRE_NATS_URL": str(kernel.nats_url),
            "GYRE_DATABASE_URL": str(kernel.database_url),
            "GYRE_BUS_PREFIX": kernel.bus_prefix,
            "GYRE_METRICS_PORT": str(metrics_port),
        }
        argv = [sys.executable, "-m", "services.scheduler", "--port", str(port)]
        pid = spawn_detached(argv, log_path=log_path, cwd=ROOT, env=env)
        address = f"127.0.0.1:{port}"
        try:
            for _ in range(300):  # bounded: 30 s
                if await asyncio.to_thread(check, address, timeout_s=1.0) is None:
                    break
                assert is_our_process(pid, "services.scheduler"), log_path.read_text()
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"scheduler did not serve in time:\n{log_path.read_text()}")
            yield address, f"http://127.0.0.1:{metrics_port}/metrics"
        finally:
            await asyncio.to_thread(terminate, pid, "services.scheduler", timeout_s=15)


async def scrape_until(url: str, name: str, **labels: str) -> float:
    """The sample's value once it is there (the server observes a call just after answering it)."""
    for _ in range(100):  # bounded: 10 s
        value = sample(await asyncio.to_thread(scrape, url), name, **labels)
        if value:
            return value
        await asyncio.sleep(0.1)
    return 0.0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_real_service_reports_rpc_latency_by_method_and_status(
    scheduler_process: tuple[str, str],
) -> None:
    address, url = scheduler_process
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError):
            await stub.GetTask(scheduler_pb2.GetTaskRequest(task_id="0190f7a2-0000-7000-8000-000000000000"))
    assert (
        await scrape_until(url, "gyre_rpc_duration_seconds_count", method=GET_TASK, code="NOT_FOUND") == 1.0
    )


@pytest.mark.asyncio(loop_scope="session")
async def test_a_real_service_reports_what_its_outbox_published(scheduler_process: tuple[str, str]) -> None:
    address, url = scheduler_process
    spec = scheduler_pb2.TaskSpec(
        name="metrics", family="terminal", prompt="p", group_size=2, timeout_s=60, harness="gyre-agent"
    )
    async with grpc.aio.insecure_channel(address) as channel:
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        await stub.SubmitTasks(scheduler_pb2.SubmitTasksRequest(request_id="metrics-1", tasks=[spec]))
    assert await scrape_until(url, "gyre_events_published_total", event_type=TASK_SUBMITTED) == 1.0
    scraped = await asyncio.to_thread(scrape, url)
    assert sample(scraped, "gyre_outbox_wait_seconds_count", producer="scheduler") >= 1
    assert sample(scraped, "gyre_rpc_duration_seconds_count", method=SUBMIT_TASKS, code="OK") == 1.0


@pytest.mark.asyncio(loop_scope="session")
async def test_a_consumer_reports_outcomes_dead_letters_and_lag(own_bus: Bus) -> None:
    bad = task_submitted()
    for envelope in (task_submitted(), bad, task_submitted()):
        await own_bus.publish(envelope)
    handled: list[str] = []

    async def handle(event: DecodedEvent) -> None:
        handled.append(event.event_id)
        if event.event_id == bad.event_id:
            raise InvalidArgument("task", "refused by the test")

    durable = "metrics-consumer"
    consumer = Consumer(
        own_bus,
        ConsumerSpec(
            durable=durable, producer="scheduler", handlers={events_pb2.TaskSubmitted: handle}, batch=1
        ),
    )
    await run_until(consumer, lambda: len(handled) == 3)

    def value(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"consumer": durable, **labels})

    assert value("gyre_events_handled_total", event_type=TASK_SUBMITTED, outcome="ok") == 2.0
    assert value("gyre_events_handled_total", event_type=TASK_SUBMITTED, outcome="dead_lettered") == 1.0
    assert value("gyre_dead_letters_total") == 1.0
    assert value("gyre_consumer_pending_messages") == 0.0


@pytest.mark.asyncio(loop_scope="session")
async def test_service_gauges_are_read_when_scraped_one_series_per_key() -> None:
    routes = {"cell-0": "active", "cell-1": "draining", "cell-2": "active"}

    def by_state() -> dict[str, float]:
        counts: dict[str, float] = {}
        for state in routes.values():
            counts[state] = counts.get(state, 0) + 1
        return counts

    register_gauge(
        "gyre_test_routes", "Routes by state (test).", by_state, labels={"proxy": "p0"}, key="state"
    )
    register_gauge("gyre_test_broken", "A reader that fails (test).", lambda: 1 / 0)
    endpoint = await serve_metrics("127.0.0.1", 0)
    try:
        scraped = await asyncio.to_thread(scrape, endpoint.url)
        routes["cell-1"] = "active"  # read again at the next scrape, not cached
        rescraped = await asyncio.to_thread(scrape, endpoint.url)
    finally:
        await endpoint.close()
    assert sample(scraped, "gyre_test_routes", proxy="p0", state="active") == 2.0
    assert sample(scraped, "gyre_test_routes", proxy="p0", state="draining") == 1.0
    assert sample(rescraped, "gyre_test_routes", proxy="p0", state="active") == 3.0
    assert not any(name == "gyre_test_broken" for name, _ in scraped)  # skipped, the rest still served


def test_the_trainer_reports_the_staleness_of_the_steps_it_publishes() -> None:
    from gyre.events import new_event
    from gyre.trainer.v1 import events_pb2 as trainer_events
    from services.trainer import metrics

    metrics.register()
    step = trainer_events.StepCompleted(staleness_mean_steps=1.5, staleness_max_steps=3, num_samples=8)
    step.version.steps = 7
    observe_published(new_event(step, producer="trainer", correlation_id="step-7"))
    assert REGISTRY.get_sample_value("gyre_trainer_step_staleness_steps", {"stat": "max"}) == 3.0
    assert REGISTRY.get_sample_value("gyre_trainer_step_staleness_steps", {"stat": "mean"}) == 1.5
    assert REGISTRY.get_sample_value("gyre_trainer_policy_version") == 7.0
