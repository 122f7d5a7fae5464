"""Process wiring shared by every service: connections, background workers, shutdown (shell).

A service's `main.py` builds a `ServiceHost` (its gRPC server plus workers such as consumers
and the outbox relay); `serve_forever` runs it until SIGINT/SIGTERM. Tests build the same host
in-process and call `start`/`stop`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from gyre.bus import Bus, BusConfig
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.db.migrate import upgrade
from gyre.outages import is_outage
from gyre.rpc import GrpcServer, stop_on_signals
from gyre.settings import KernelSettings, resolve_urls

log = structlog.get_logger(__name__)
OUTAGE_RETRY_MAX_S = 5.0
"""Longest pause before a worker that died of an outage is started again."""

Worker = Callable[[asyncio.Event], Awaitable[None]]


@dataclass(slots=True, kw_only=True)
class Connections:
    bus: Bus
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    async def close(self) -> None:
        await self.bus.close()
        await self.engine.dispose()


async def connect(kernel: KernelSettings, *, service: str, migrations: Path | None) -> Connections:
    """Open the bus and the database for one service, first migrating its schema (named after the
    service) from its own `migrations` folder when one is given."""
    urls = resolve_urls(kernel)
    if migrations is not None:
        await asyncio.to_thread(upgrade, service, urls.database_url, script_location=migrations)
    engine = make_engine(urls.database_url)
    config = BusConfig(
        url=urls.nats_url,
        prefix=kernel.bus_prefix,
        max_age_s=kernel.stream_max_age_s,
        max_bytes=kernel.stream_max_bytes,
    )
    bus = await Bus.connect(config, name=f"gyre-{service}")
    return Connections(bus=bus, engine=engine, sessions=make_sessionmaker(engine))


@dataclass(slots=True, kw_only=True)
class ServiceHost:
    name: str
    server: GrpcServer
    connections: Connections | None
    workers: list[Worker] = field(default_factory=list)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def address(self) -> str:
        return self.server.address

    async def start(self) -> None:
        await self.server.start()
        self._tasks = [asyncio.create_task(self._guard(w)) for w in self.workers]
        log.info("service_started", service=self.name, address=self.address)

    async def _guard(self, worker: Worker) -> None:
        """A worker that dies takes the process down: a half-working service is worse than none.
        One that died because Postgres or NATS went away (`is_outage`: a restart, a failover) is
        started again after a back-off instead, for as long as the outage lasts: an outage is a
        wait, and a process that exited would only find the dependency still away on its start."""
        attempt = 0
        for _ in range(100_000_000):  # bounded by `stop_event` and by non-outage failures
            ran_from = time.monotonic()
            try:
                await worker(self.stop_event)
                return
            except Exception as exc:
                if not is_outage(exc) or self.stop_event.is_set():
                    log.exception("worker_crashed", service=self.name)
                    self.stop_event.set()
                    raise
                if time.monotonic() - ran_from > 60.0:  # it ran a while: a new outage
                    attempt = 0
                log.warning("worker_dependency_unavailable", service=self.name, error=type(exc).__name__)
                await asyncio.sleep(min(0.5 * 2**attempt, OUTAGE_RETRY_MAX_S))
                attempt += 1

    async def stop(self, grace_s: float = 5.0) -> None:
        self.stop_event.set()
        await self.server.stop(grace_s)
        done, pending = (
            await asyncio.wait(self._tasks, timeout=grace_s + 5) if self._tasks else (set(), set())
        )
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.connections is not None:
            await self.connections.close()
        log.info("service_stopped", service=self.name, workers_done=len(done), workers_cancelled=len(pending))

    async def serve_forever(self) -> None:
        stop_on_signals(self.stop_event)
        await self.start()
        await self.stop_event.wait()
        await self.stop()
