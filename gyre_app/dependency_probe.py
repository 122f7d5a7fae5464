"""Ask Postgres and NATS whether they answer, once and quickly, for a command (shell).

A command must end even when a server is away, so each probe is one try with a short timeout,
and what it says names what is away rather than raising.
"""

from __future__ import annotations

import asyncio

import asyncpg
import nats
from nats.aio.client import Client as NatsClient

from gyre.db.engine import libpq_url
from gyre.errors import Unavailable
from gyre.logs import redact

PROBE_TIMEOUT_S = 3.0


async def connect_once(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> NatsClient:
    """A NATS connection for one command: one try, `Unavailable` naming the server when it is away."""

    async def quiet(exc: Exception) -> None:  # the failure is raised below, once, not printed per try
        return None

    try:
        # nats-py keeps retrying a refused first connect unless its server leaves the pool, which
        # only a positive attempt limit does; the timeout bounds the whole try besides.
        async with asyncio.timeout(2 * timeout_s + 1):
            return await nats.connect(
                url,
                name="gyre-cli",
                connect_timeout=timeout_s,
                allow_reconnect=False,
                max_reconnect_attempts=1,
                error_cb=quiet,
            )
    except Exception as exc:  # refused, timed out, bad credentials: each means the bus cannot be used
        raise Unavailable(f"NATS at {redact(url)} is not reachable ({type(exc).__name__})") from exc


async def postgres_health(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """`ok`, or `away: <why>` when Postgres does not answer a trivial query in time."""
    try:
        conn = await asyncpg.connect(libpq_url(url), timeout=timeout_s)
        try:
            await conn.fetchval("SELECT 1", timeout=timeout_s)
        finally:
            await conn.close(timeout=timeout_s)
    except Exception as exc:  # refused, starting up, timed out: all say the database is away
        return f"away: Postgres at {redact(url)} does not answer ({type(exc).__name__})"
    return "ok"
