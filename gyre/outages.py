"""Turn an unexpected exception into an error a caller may see, without internals (shell).

A handler that lets a database or bus failure escape would otherwise answer with the driver's
message, which can hold the SQL statement and its parameters. A lost connection (Postgres or
NATS restarting) becomes `Unavailable` (retry later); anything else is a bug, answered as an
internal error with an id that finds the logged traceback, never with its text.
"""

from __future__ import annotations

import asyncpg
import nats.errors
import sqlalchemy.exc
import structlog

from gyre.errors import GyreError, Unavailable
from gyre.ids import new_uuid7

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


def translate(exc: Exception, *, where: str) -> GyreError:
    """The GyreError to answer for an unexpected exception (logged here, with its traceback)."""
    if is_outage(exc):
        log.warning("dependency_unavailable", where=where, error=type(exc).__name__)
        return Unavailable("a dependency of the service (database or bus) is unavailable; retry later")
    error_id = new_uuid7()
    log.error("internal_error", where=where, error_id=error_id, exc_info=exc)
    return InternalError(f"internal error (error id {error_id}; details are in the service log)")
