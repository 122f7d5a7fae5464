"""The local stack's embedded NATS and Postgres: back on their ports, a database, stopped (shell)."""

from __future__ import annotations

import asyncio
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg

from gyre.db.engine import libpq_url, with_database
from gyre.devstack.embedded import start_nats, start_postgres, stop_nats_in, stop_postgres

if TYPE_CHECKING:
    from gyre_app.stack import StackState


def servers_back(state: StackState, state_dir: Path) -> bool:
    """The stack's embedded NATS and Postgres run at the addresses its services were given,
    started again on them if they had stopped; False when one came back elsewhere."""
    same = True
    if state.embedded_nats:
        parts = urllib.parse.urlsplit(state.nats_url)  # a secure stack's NATS asks for its user
        auth = None
        if parts.username and parts.password:
            auth = (urllib.parse.unquote(parts.username), urllib.parse.unquote(parts.password))
        same &= _port(start_nats(state_dir / "nats", auth=auth).url) == _port(state.nats_url)
    if state.embedded_postgres:
        same &= _port(start_postgres(state_dir / "postgres").url) == _port(state.database_url)
    return same


def _port(url: str) -> int | None:
    return urllib.parse.urlsplit(url).port


def stop_embedded_servers(state_dir: Path) -> list[str]:
    """Stop the embedded servers the tests and benchmarks leave running under `state_dir`."""
    stopped = []
    for folder in sorted(p for p in state_dir.resolve().glob("*-servers") if p.is_dir()):
        if stop_nats_in(folder / "nats"):
            stopped.append(f"{folder.name}/nats")
        if (folder / "postgres" / "postmaster.pid").exists():
            stop_postgres(folder / "postgres")
            stopped.append(f"{folder.name}/postgres")
    return stopped


def ensure_database(server_url: str, name: str) -> str:
    """Create database `name` on the server if missing; return its URL."""

    async def create() -> None:
        conn = await asyncpg.connect(libpq_url(server_url))
        try:
            if not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
                await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()

    asyncio.run(create())
    return with_database(server_url, name)
