"""A throw-away database and bus prefix on given servers, for benchmarks and tests (shell).

Each use gets its own Postgres database and JetStream subject prefix, so runs on one machine
never see each other's rows or events, and both are removed afterwards.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import asyncpg
import nats

from gyre.db.engine import libpq_url, with_database
from gyre.settings import KernelSettings


@asynccontextmanager
async def scratch_kernel(
    nats_url: str, admin_database_url: str, *, label: str
) -> AsyncIterator[KernelSettings]:
    """Kernel settings naming a fresh database `gyre_<label>_<hex>` and prefix; both dropped on exit."""
    name = f"gyre_{label}_{uuid.uuid4().hex[:10]}"
    prefix = f"s{uuid.uuid4().hex[:9]}"
    admin = await asyncpg.connect(libpq_url(admin_database_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield KernelSettings(
            nats_url=nats_url, database_url=with_database(admin_database_url, name), bus_prefix=prefix
        )
    finally:
        nc = await nats.connect(nats_url)
        try:
            js = nc.jetstream()
            for info in await js.streams_info():
                stream = info.config.name or ""
                if stream.startswith(prefix.upper()):
                    await js.delete_stream(stream)
        finally:
            await nc.close()
        admin = await asyncpg.connect(libpq_url(admin_database_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
