"""Control-plane figures of a running stack over a measured window (shell: /proc, Prometheus, Postgres).

A benchmark (bench.scale, bench.load) opens a window around its load and reads, for the window
alone (each figure is the difference of two readings):

- `scheduler_decision_p99_ms`: the live driver's decision rounds (`gyre_scheduler_decision_seconds`);
- `event_lag_p99_ms`: publication (storage in the stream) to fetch by a consumer, over every
  consumer of the scraped services (`gyre_event_lag_seconds`);
- `cpu_s_per_1000_calls`: CPU seconds of the given processes (and the processes they started,
  such as a proxy's other processes) per 1,000 model calls the benchmark counted;
- `postgres_rows_per_s`: rows inserted, updated and deleted in the stack's database per second
  (`pg_stat_database`, which Postgres updates within about a second: short windows read low).

Percentiles come from histogram buckets (the upper bound of the bucket holding the quantile),
so they are as coarse as the buckets: `*_p99_ms` reads "at most".

Usage:
    probe = ControlPlane(pids=[...], metrics_urls=[...], database_url=url)
    await probe.start()
    ... the load ...
    figures = await probe.stop(calls=n)
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from gyre.db.engine import libpq_url

DECISION = "gyre_scheduler_decision_seconds"
EVENT_LAG = "gyre_event_lag_seconds"


def process_tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and its children, as /proc has them; 0 for one gone."""
    total = 0.0
    tick = 100.0  # USER_HZ on Linux
    for p in [pid, *_children(pid)]:
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return [c for child in out for c in (child, *_children(child))]


def buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts of histogram `name` (summed over its label values) in a scrape."""
    out: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name == f"{name}_bucket":
                le = float(sample.labels["le"])
                out[le] = out.get(le, 0.0) + sample.value
    return out


def quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of what was observed between two
    readings of one histogram; None when nothing was; inf when it is past the last bound."""
    window = sorted((le, after.get(le, 0.0) - before.get(le, 0.0)) for le in after)
    total = window[-1][1] if window else 0.0
    if total <= 0:
        return None
    for le, count in window:
        if count >= q * total:
            return le
    return math.inf


def _add(into: dict[float, float], more: dict[float, float]) -> None:
    for le, n in more.items():
        into[le] = into.get(le, 0.0) + n


@dataclass(slots=True)
class Reading:
    at_s: float
    cpu_s: float
    rows: int
    decision: dict[float, float] = field(default_factory=dict)
    lag: dict[float, float] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class ControlPlane:
    """The stack's processes, their metrics endpoints and its database: see the module doc."""

    pids: Iterable[int]
    metrics_urls: Iterable[str] = ()
    database_url: str | None = None
    _start: Reading | None = None

    async def read(self) -> Reading:
        reading = Reading(
            at_s=time.monotonic(),
            cpu_s=sum(process_tree_cpu_s(p) for p in self.pids),
            rows=await self._rows(),
        )
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            for url in self.metrics_urls:
                async with http.get(url) as answer:
                    text = await answer.text()
                _add(reading.decision, buckets(text, DECISION))
                _add(reading.lag, buckets(text, EVENT_LAG))
        return reading

    async def _rows(self) -> int:
        if not self.database_url:
            return 0
        conn = await asyncpg.connect(libpq_url(self.database_url))
        try:
            value = await conn.fetchval(
                "SELECT COALESCE(tup_inserted + tup_updated + tup_deleted, 0) FROM pg_stat_database"
                " WHERE datname = current_database()"
            )
        finally:
            await conn.close()
        return int(value or 0)

    async def start(self) -> None:
        self._start = await self.read()

    async def stop(self, *, calls: int) -> dict[str, float | None]:
        """The window's figures (see the module doc); `calls`: model calls made in it."""
        assert self._start is not None, "start() first"
        end, start = await self.read(), self._start
        wall = max(end.at_s - start.at_s, 1e-9)

        def ms(value: float | None) -> float | None:
            return None if value is None else round(value * 1000, 1)

        return {
            "window_s": round(wall, 2),
            "scheduler_decision_p99_ms": ms(quantile(start.decision, end.decision, 0.99)),
            "event_lag_p99_ms": ms(quantile(start.lag, end.lag, 0.99)),
            "cpu_s_per_1000_calls": round((end.cpu_s - start.cpu_s) * 1000 / calls, 3) if calls else None,
            "postgres_rows_per_s": round((end.rows - start.rows) / wall, 1),
        }
