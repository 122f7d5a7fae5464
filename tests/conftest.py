"""Shared fixtures: real NATS and real Postgres, isolated per test session.

Each session gets its own database (created and dropped here) and its own bus prefix, so test
runs never see each other's streams or rows. With GYRE_NATS_URL / GYRE_DATABASE_URL unset the
embedded servers of the local stack are started (and reused across runs).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import nats
import pytest
import pytest_asyncio

from gyre.bus import Bus, BusConfig
from gyre.db.engine import libpq_url, with_database
from gyre.settings import KernelSettings

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def server_urls() -> Iterator[tuple[str, str]]:
    nats_url = os.environ.get("GYRE_NATS_URL")
    database_url = os.environ.get("GYRE_DATABASE_URL")
    if nats_url and database_url:
        yield nats_url, database_url
        return
    from gyre.devstack.embedded import start_nats, start_postgres

    state = REPO_ROOT / ".gyre" / "test-servers"
    nats_server = start_nats(state / "nats")
    pg_server = start_postgres(state / "postgres")
    # Left running on purpose: the next `make test` reuses them; `gyre down --all` stops them.
    yield nats_url or nats_server.url, database_url or pg_server.url


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def database_url(server_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A fresh database for this test session, dropped afterwards."""
    admin_url = server_urls[1]
    name = f"gyre_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(libpq_url(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    yield with_database(admin_url, name)
    admin = await asyncpg.connect(libpq_url(admin_url))
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def bus_prefix(server_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A subject/stream prefix of this session's own; its streams are deleted afterwards."""
    prefix = f"t{uuid.uuid4().hex[:10]}"
    yield prefix
    nc = await nats.connect(server_urls[0])
    js = nc.jetstream()
    for info in await js.streams_info():
        name = info.config.name or ""
        if name.startswith(prefix.upper()) or name.startswith(f"OBJ_{prefix}"):
            await js.delete_stream(name)
    await nc.close()


@pytest.fixture(scope="session")
def kernel(server_urls: tuple[str, str], database_url: str, bus_prefix: str) -> KernelSettings:
    return KernelSettings(nats_url=server_urls[0], database_url=database_url, bus_prefix=bus_prefix)


@pytest_asyncio.fixture(loop_scope="session")
async def own_bus(kernel: KernelSettings) -> AsyncIterator[Bus]:
    """A bus under a prefix of this test's own (inside the session's, so it is cleaned up): a
    consumer that reads its stream from the start sees only this test's events."""
    assert kernel.nats_url is not None
    bus = await Bus.connect(
        BusConfig(url=kernel.nats_url, prefix=f"{kernel.bus_prefix}{uuid.uuid4().hex[:8]}")
    )
    yield bus
    await bus.close()
