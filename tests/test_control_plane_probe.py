"""bench.control_plane: the window figures a scale benchmark reads (histogram quantiles from two
scrapes, process CPU, Postgres rows), on a real Postgres."""

from __future__ import annotations

import asyncio
import math
import os

import asyncpg
import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from bench.control_plane import ControlPlane, buckets, process_tree_cpu_s, quantile
from gyre.db.engine import libpq_url
from gyre.settings import KernelSettings


def _scrape(registry: CollectorRegistry) -> dict[float, float]:
    return buckets(generate_latest(registry).decode(), "demo_seconds")


def test_quantiles_are_read_from_the_window_between_two_scrapes() -> None:
    registry = CollectorRegistry()
    h = Histogram("demo_seconds", "demo", ["consumer"], buckets=(0.01, 0.1, 1.0), registry=registry)
    for _ in range(50):  # before the window: slow, must not count
        h.labels(consumer="a").observe(0.5)
    before = _scrape(registry)
    for _ in range(98):
        h.labels(consumer="a").observe(0.005)
    h.labels(consumer="b").observe(0.05)  # label values are summed
    h.labels(consumer="b").observe(0.5)
    after = _scrape(registry)
    assert quantile(before, after, 0.5) == 0.01
    assert quantile(before, after, 0.99) == 0.1
    assert quantile(before, after, 1.0) == 1.0
    assert quantile(after, after, 0.99) is None  # nothing observed in the window
    h.labels(consumer="a").observe(5.0)
    assert quantile(after, _scrape(registry), 0.99) == math.inf


@pytest.mark.asyncio(loop_scope="session")
async def test_cpu_and_rows_of_a_window(kernel: KernelSettings) -> None:
    assert kernel.database_url
    probe = ControlPlane(pids=[os.getpid()], database_url=kernel.database_url)
    await probe.start()
    sum(i * i for i in range(2_000_000))  # some CPU of this process
    conn = await asyncpg.connect(libpq_url(kernel.database_url))
    try:
        await conn.execute("CREATE TEMP TABLE probe_rows (n int)")
        await conn.execute("INSERT INTO probe_rows SELECT generate_series(1, 500)")
    finally:
        await conn.close()
    figures: dict[str, float | None] = {}
    for _ in range(30):  # Postgres publishes its counters within about a second
        figures = await probe.stop(calls=10)
        if (figures["postgres_rows_per_s"] or 0) > 0:
            break
        await asyncio.sleep(0.2)
    assert (figures["postgres_rows_per_s"] or 0) > 0
    assert (figures["cpu_s_per_1000_calls"] or 0) > 0
    assert figures["scheduler_decision_p99_ms"] is None  # no metrics endpoint was given
    assert process_tree_cpu_s(os.getpid()) > 0
    assert process_tree_cpu_s(2**22 + 12345) == 0.0  # no such process
