"""Which service's projections `gyre replay` rebuilds, from which log, and the runs (shell).

The trajectory service folds its call log (`trajectory.calls`) into its tree projections. The
scheduler, runner, evaluator and trainer fold their outboxes (the events each published, kept in
its own schema) into the columns those events determine; each service's `event_projection`
module says which, and what its events do not determine. The proxy, engines and cell agents
have no projection to rebuild: said here and in the command's help, not faked.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from gyre.db.outbox_replay import EventProjection, OutboxRange, OutboxReplay, replay_outbox
from gyre.errors import InvalidArgument, Unavailable

T = TypeVar("T")
OUTBOX_SERVICES = ("scheduler", "runner", "evaluator", "trainer")
REPLAYABLE = ("trajectory", *OUTBOX_SERVICES)
NOT_EVENT_SOURCED = {
    "proxy": "its tables (execution tokens, engine routes, recorded call ids) are written by RPCs, and "
    "its LlmCallRecorded events are the trajectory service's log: replay `trajectory`",
    "engine": "it keeps no tables",
    "cell": "it keeps no tables",
}
HELP = (
    "whose projections to rebuild: trajectory (its call log), or scheduler, runner, evaluator, trainer "
    "(the columns their own events determine; `--json` lists what is not replayed). The proxy, engines "
    "and cell agents have no event-sourced projection."
)


def projection_of(service: str) -> EventProjection:
    module = importlib.import_module(f"services.{service}.event_projection")
    projection: EventProjection = module.PROJECTION
    return projection


def check_service(service: str) -> str:
    if service in REPLAYABLE:
        return service
    if service in NOT_EVENT_SOURCED:
        raise InvalidArgument(
            "--service", f"{service} has no event-sourced projection to replay: {NOT_EVENT_SOURCED[service]}"
        )
    raise InvalidArgument("--service", f"unknown service {service!r}; replayable: {', '.join(REPLAYABLE)}")


def on_database(service: str, work: Callable[[Any], Awaitable[T]]) -> T:
    """Run `work(pg)` on a connection to the stack's database, unreachable or unmigrated said plainly."""
    import asyncpg

    from gyre.db.engine import libpq_url
    from gyre.settings import KernelSettings
    from services.trajectory.cli import database_url

    async def go() -> T:
        url = database_url(KernelSettings())
        try:
            pg = await asyncpg.connect(libpq_url(url), timeout=10)
        except (OSError, asyncpg.PostgresError) as exc:
            raise Unavailable(
                f"the {service} service's database is not reachable ({exc}): start the stack with "
                "`gyre up`, or point GYRE_DATABASE_URL at it"
            ) from None
        try:
            return await work(pg)
        except asyncpg.UndefinedTableError:
            raise Unavailable(f"the database holds no {service} tables: run `gyre migrate`") from None
        finally:
            await pg.close()

    return asyncio.run(go())


def replay_service_log(
    service: str, *, since: datetime | None, from_position: int | None, keep_scratch: bool
) -> OutboxReplay:
    projection = projection_of(service)
    log_range = OutboxRange(since=since, from_position=from_position)
    return on_database(
        service, lambda pg: replay_outbox(pg, projection, log_range, keep_scratch=keep_scratch)
    )
