"""The lost-execution watchdog: executions no runner reports an end for are cancelled, then ended
(shell: SQL + the runner's CancelExecution + outbox, run by the driver's loop).

The runner ends every harness by its limit (`timed_out`), and when a runner dies its keeper
reports the executions it held. When both are gone nobody would: the group would wait for that
member forever. `policy.liveness.overdue_executions` names the executions past their limit plus
`GYRE_SCHEDULER_LOST_GRACE_S`; the watchdog asks the runner to cancel each once (idempotent
`request_id` `watchdog-<execution>`: a runner that is alive ends it `cancelled` and that event
ends the wait). Past a further grace, with still no end event, it records the execution
`infra_failed` with the reason through `replacements.record_lost`, in one transaction with the
`ExecutionReplacementDecided` (`lost`) it publishes: the group is replaced or trains without it.

When each execution entered its state is what this process first saw (kept in memory, no later
than the truth, so the watchdog never acts before the runner's own limit); after a restart the
count starts again, so the bound grows by the restart and stays bounded. Time it could not look
(the database away, so the round failed) does not count either (`blind_time_s`): end events held
back meanwhile are read first. A bus outage is not seen here; the grace (default 300 s, and the
cancel asked first) is what covers a backlog of end events after one. A late end event for an
execution ended here changes nothing (its state has moved past the end states).
"""

from __future__ import annotations

import time
import uuid

import grpc
import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.tls import aio_channel
from services.scheduler import repo
from services.scheduler.config import SchedulerSettings
from services.scheduler.lifecycle import task_done_if_all_ended
from services.scheduler.policy.liveness import Overdue, WatchedExecution, blind_time_s, overdue_executions
from services.scheduler.replacements import record_lost

log = structlog.get_logger(__name__)
WATCHED = ("admitted", "running")


class Watchdog:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], relay: OutboxRelay, settings: SchedulerSettings
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.settings = settings
        self.seen: dict[str, tuple[str, float]] = {}
        """execution id -> (state, when this process first saw it in that state)."""
        self.asked: set[str] = set()
        """Executions the runner was asked to cancel (once per process)."""
        self.every_s = min(5.0, settings.lost_grace_s / 4)
        """How often `check_once` looks: a fraction of the grace, so it acts close to it."""
        self.last_s = 0.0
        self.last_look_s: float | None = None
        """When the last check read the table (None: not yet)."""

    async def check_if_due(self) -> None:
        now = time.time()
        if now - self.last_s >= self.every_s:
            self.last_s = now
            await self.check_once(now_s=now)

    async def check_once(self, *, now_s: float) -> tuple[Overdue, ...]:
        e, t = repo.executions.c, repo.tasks.c
        async with self.sessions() as session:
            rows = (
                await session.execute(
                    sa.select(e.execution_id, e.state, t.timeout_s, t.deadline)
                    .join(repo.tasks, t.task_id == e.task_id)
                    .where(e.state.in_(WATCHED))
                )
            ).all()
        if self.last_look_s is not None:
            blind = blind_time_s(last_look_s=self.last_look_s, now_s=now_s, every_s=self.every_s)
            self.seen = {k: (state, since + blind) for k, (state, since) in self.seen.items()}
        self.last_look_s = now_s
        watched = []
        current: dict[str, tuple[str, float]] = {}
        for row in rows:
            key = str(row.execution_id)
            state, since = self.seen.get(key, (row.state, now_s))
            if state != row.state:  # admitted -> running: the runner's limit counts from here
                state, since = row.state, now_s
            current[key] = (state, since)
            watched.append(
                WatchedExecution(
                    execution_id=key,
                    state=state,
                    since_s=since,
                    timeout_s=row.timeout_s,
                    deadline_s=None if row.deadline is None else row.deadline.timestamp(),
                )
            )
        self.seen = current
        self.asked &= set(current)
        overdue = overdue_executions(watched, now_s=now_s, grace_s=self.settings.lost_grace_s)
        for item in overdue:
            if item.action == "cancel" and item.execution_id not in self.asked:
                self.asked.add(item.execution_id)
                await self._ask_runner(item)
            elif item.action == "end":
                await self._end(item)
        return overdue

    async def _ask_runner(self, item: Overdue) -> None:
        log.warning("execution_overdue_cancel_asked", execution_id=item.execution_id, reason=item.reason)
        if not self.settings.runner_address:
            log.warning("execution_overdue_no_runner_address", execution_id=item.execution_id)
            return
        try:
            async with aio_channel(self.settings.runner_address) as channel:
                await runner_pb2_grpc.RunnerServiceStub(channel).CancelExecution(  # type: ignore[misc]
                    runner_pb2.CancelExecutionRequest(
                        request_id=f"watchdog-{item.execution_id}",
                        execution_id=item.execution_id,
                        reason=item.reason,
                    ),
                    timeout=30,
                )
        except grpc.aio.AioRpcError as exc:  # the runner is away too: the end follows a grace later
            log.warning(
                "execution_overdue_cancel_failed", execution_id=item.execution_id, error=exc.code().name
            )

    async def _end(self, item: Overdue) -> None:
        async with self.sessions() as session, session.begin():
            events = await record_lost(
                session, item.execution_id, reason=item.reason, causation_id=f"watchdog-{item.execution_id}"
            )
            if not events:
                return  # its end or grade came meanwhile
            await enqueue(session, repo.outbox, *events)
            await task_done_if_all_ended(session, uuid.UUID(events[-1].correlation_id))
        self.seen.pop(item.execution_id, None)
        log.warning("execution_lost_ended", execution_id=item.execution_id, reason=item.reason)
        self.relay.poke()
