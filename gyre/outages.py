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
import nats.js.errors
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
    # A NATS server stopping or starting: the connection drops mid-request, or JetStream answers
    # 503 / nobody answers before it is up (a consumer's fetch crashed a scheduler on these).
    nats.errors.UnexpectedEOF,
    nats.errors.StaleConnectionError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.NoRespondersError,
    nats.js.errors.ServiceUnavailableError,
)


DEPENDENCY_AWAY = "a dependency of the service (database or bus) is unavailable; retry later"
"""What a service answers (UNAVAILABLE) while its Postgres or NATS is away: clients tell it apart
from the service itself being unreachable."""


class InternalError(GyreError):
    """A bug: the caller gets this message and an id; the traceback is in the service's log."""


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says a dependency is away rather than that the request or the code is wrong.

    The driver's own error may sit a few causes down: SQLAlchemy's asyncpg adapter raises its
    generic `Error` from asyncpg's `CannotConnectNowError` ("the database system is shutting
    down") and wraps that in a `DBAPIError`, so the chain of causes is followed.
    """
    seen: BaseException | None = exc
    for _ in range(8):  # bounded: a chain is a few links long
        if seen is None:
            return False
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, _CONNECTION_ERRORS):
            return True
        orig = seen.orig if isinstance(seen, sqlalchemy.exc.DBAPIError) else None
        seen = orig if isinstance(orig, BaseException) else seen.__cause__
    return False


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
        return Unavailable(DEPENDENCY_AWAY)
    error_id = new_uuid7()
    log.error("internal_error", where=where, error_id=error_id, exc_info=exc)
    return InternalError(f"internal error (error id {error_id}; details are in the service log)")
