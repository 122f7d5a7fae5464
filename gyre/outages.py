"""Tell an outage from a failure, probe the database, and answer callers without internals (shell).

A handler that lets a database or bus failure escape would otherwise answer with the driver's
message, which can hold the SQL statement and its parameters. A lost connection (Postgres or
NATS restarting) becomes `Unavailable` (retry later); anything else is a bug, answered as an
internal error with an id that finds the logged traceback, never with its text. A consumer
uses `failure_fate` and `database_answers` to wait out an outage instead of counting it.
"""

from __future__ import annotations

import asyncio

import asyncpg
import nats.errors
import sqlalchemy as sa
import sqlalchemy.exc
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import GyreError, Unavailable
from gyre.ids import new_uuid7
from gyre.settle import Fate

log = structlog.get_logger(__name__)

_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.InterfaceError,
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    sqlalchemy.exc.TimeoutError,
    nats.errors.ConnectionClosedError,
    nats.errors.NoServersError,
    nats.errors.TimeoutError,
)


class InternalError(GyreError):
    """A bug: the caller gets this message and an id; the traceback is in the service's log."""


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says a dependency is away rather than that the request or the code is wrong."""
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.orig is not None:
        return is_outage(exc.orig)
    return isinstance(exc, _CONNECTION_ERRORS)


def failure_fate(exc: BaseException) -> Fate:
    """UNAVAILABLE when a handler's failure reads as Postgres or NATS being away (its consumer
    then probes them before it counts anything), else FAILED."""
    return Fate.UNAVAILABLE if is_outage(exc) else Fate.FAILED


async def database_answers(sessions: async_sessionmaker[AsyncSession], *, timeout_s: float = 5.0) -> bool:
    """Whether the database answers a trivial query within `timeout_s` (a restart refuses it, a
    cut network lets it time out)."""
    try:
        async with asyncio.timeout(timeout_s), sessions() as session:
            await session.execute(sa.text("SELECT 1"))
    except Exception as exc:
        if isinstance(exc, TimeoutError) or is_outage(exc):
            return False
        raise
    return True


def translate(exc: Exception, *, where: str) -> GyreError:
    """The GyreError to answer for an unexpected exception (logged here, with its traceback)."""
    if is_outage(exc):
        log.warning("dependency_unavailable", where=where, error=type(exc).__name__)
        return Unavailable("a dependency of the service (database or bus) is unavailable; retry later")
    error_id = new_uuid7()
    log.error("internal_error", where=where, error_id=error_id, exc_info=exc)
    return InternalError(f"internal error (error id {error_id}; details are in the service log)")
