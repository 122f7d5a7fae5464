"""Runs each execution's harness in its sandbox from start to end event (shell).

One asyncio task per execution: sandbox, workspace, token (registered with the proxy), launch,
`ExecutionStarted`, wait with the deadline, exactly one end event, token revoked. State changes
and their events commit in one transaction (outbox). Tokens never leave this process except to
the proxy and the harness's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import secrets
import sys
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import GyreError
from gyre.events import new_event
from gyre.outages import is_outage
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.runner.v1 import events_pb2, runner_pb2
from gyre.sandbox.adopt import adopt
from gyre.sandbox.blame import CANCELLED, HostFacts, blame
from gyre.sandbox.host import Forward, Outcome, Sandbox, SandboxHost
from gyre.sandbox.oci import OciBackend
from services.runner import repo
from services.runner.codec import FAILURE_VALUES, execution_ref
from services.runner.config import RunnerSettings
from services.runner.container_adopt import adopt_container, adopt_running, sweep_containers
from services.runner.container_exec import CONTAINER_FAMILIES, PROMPT_FILE, ContainerSandbox
from services.runner.executions import Launch, recovered_launch
from services.runner.harness import HarnessInput, crash_reason, plan_launch, spent_own_budget
from services.runner.prepare import LaunchFailed, fill_sandbox, start_container

log = structlog.get_logger(__name__)
PRODUCER = "runner"
REAP_EVERY_S = 5.0
RETRIED_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})
FILL_TIMEOUT_S = 300.0
RECOVER_REVOKE_RETRY_S = 10.0
COMMIT_TRIES = 10_000
SHUTDOWN_WAIT_S = 8.0
"""How long a stopping runner waits for its launches to reach their harness and for its ended
executions to record their end: within the host's grace for its workers (`ServiceHost.stop`:
grace_s + 5 s), which then cancels them."""


@dataclass(slots=True)
class Running:
    launch: Launch
    task: asyncio.Task[None]
    started: asyncio.Future[None]
    box: Sandbox | ContainerSandbox | None = None
    cancel: tuple[str, str] | None = None
    """(reason, request_id) once CancelExecution asked."""
    registered: bool = False
    """The execution's token was (or may have been) registered with the proxy."""
    num_calls: int | None = None
    """Calls the proxy recorded for the execution, once its token is revoked."""
    failed_calls: tuple[int, str] = (0, "")
    """Calls the proxy failed (5xx) and the last one's message, once its token is revoked."""
    revoke_retry_s: float | None = None
    """How long to retry the revocation while the proxy is away (None: the settings')."""
    in_slot: bool = False
    """It holds one of the `max_running` slots (it is being launched, runs or ends)."""
    waiting: bool = False
    """Its harness runs and is recorded as running: a stopping runner can leave it to its keeper."""


class Supervisor:
    def __init__(
        self,
        *,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        host: SandboxHost,
        settings: RunnerSettings,
        proxy: proxy_pb2_grpc.ProxyServiceStub | None,
    ):
        self.sessions = sessions
        self.relay = relay
        self.host = host
        self.settings = settings
        self.proxy: Any = proxy  # grpc.aio stub: its calls are awaitable at run time
        self.forward = _forward(settings.proxy_base_url)
        self.running: dict[str, Running] = {}
        self.ended: dict[str, tuple[Sandbox | ContainerSandbox, float]] = {}
        self.slots = asyncio.Semaphore(settings.max_running)
        self.stopping = False
        """Set on shutdown: no harness is launched any more."""
        self.containers: OciBackend | None = None
        """Runs container tasks (`swebench`, `harbor`); None when this host has no engine (wiring sets it)."""

    def start(
        self, launch: Launch, *, reattach: Callable[[Running], Awaitable[None]] | None = None
    ) -> Running:
        """Run an execution already recorded as `starting` (or, with `reattach`, one a previous
        runner process started and that still runs in its sandbox)."""
        loop = asyncio.get_running_loop()
        run = Running(launch=launch, task=None, started=loop.create_future())  # type: ignore[arg-type]
        run.task = asyncio.create_task(self._guarded(run, reattach or self._run))
        self.running[launch.execution_id] = run
        return run

    async def _guarded(self, run: Running, body: Callable[[Running], Awaitable[None]]) -> None:
        eid = run.launch.execution_id
        structlog.contextvars.bind_contextvars(execution_id=eid)
        try:
            async with self.slots:
                run.in_slot = True
                await body(run)
        except LaunchFailed as exc:
            await self._end_failed(run, exc.kind, exc.reason)
        except Exception as exc:  # a runner bug must still end the execution, never leave it running
            log.exception("execution_crashed")
            await self._end_failed(run, "runner_lost", f"runner error: {type(exc).__name__}: {exc}")
        finally:
            if not run.started.done():
                run.started.set_result(None)
            self.running.pop(eid, None)
            if run.box is not None:
                self.ended[eid] = (run.box, time.monotonic())

    async def _run(self, run: Running) -> None:
        launch = run.launch
        if self.stopping:
            raise LaunchFailed("runner_lost", "the runner stopped before the harness started")
        box: Sandbox | ContainerSandbox
        runtime: tuple[str, ...] = ()
        keep = functools.partial(setattr, run, "box")  # set as soon as made: released if this fails
        if launch.family in CONTAINER_FAMILIES:
            box = await start_container(self.containers, self.settings, launch, self.forward, keep=keep)
            prompt_file, python = PROMPT_FILE, "python3"
        else:
            box = await fill_sandbox(self.host, self.settings, launch, keep=keep)
            prompt_file, python = str(box.home / "prompt.md"), sys.executable
            runtime = tuple(self.settings.sandbox_runtime)
        if run.cancel is not None:
            await self._end(run, "cancelled", _cancelled(run, box))
            return
        # A stopping runner still launches a harness it has filled a workspace for: the stop hands
        # running harnesses to their keepers (`_shut_down`), so this one carries on like the others.
        token = secrets.token_urlsafe(32)
        now = datetime.now(UTC)
        deadline = now + timedelta(seconds=launch.timeout_s)
        run.registered = True
        await self._register(
            launch, token, expires_at=deadline + timedelta(seconds=self.settings.token_grace_s)
        )
        plan = plan_launch(
            launch.harness,
            HarnessInput(
                base_url=box.base_url(self.forward) + self.forward_path,
                token=token,
                prompt_file=prompt_file,
                python=python,
                model=self.settings.agent_model,
                extra_env={**self.settings.harness_env, **dict(launch.harness_env)},
                runtime=runtime,
                timeout_s=launch.timeout_s,
            ),
        )
        del token
        try:
            await box.launch(plan.argv, env=plan.env, forward=self.forward)
        except OSError as exc:
            await self._revoke(run, cancel_in_flight=True)
            raise LaunchFailed("harness_launch", f"harness process could not start: {exc}") from exc
        started = events_pb2.ExecutionStarted(
            execution=execution_ref(launch),
            harness=launch.harness,
            workspace_uri=box.work.as_uri(),
            request_id=launch.request_id,
        )
        started.started_at.FromDatetime(now)
        started.deadline.FromDatetime(deadline)
        await self._commit(
            launch,
            started,
            state="running",
            workspace_uri=box.work.as_uri(),
            started_at=now,
            deadline=deadline,
        )
        run.started.set_result(None)
        isolation = box.isolation.describe() if isinstance(box, Sandbox) else f"oci container {box.name}"
        log.info("execution_started", harness=launch.harness, isolation=isolation)
        await self._wait_and_finish(run, box, timeout_s=launch.timeout_s)

    async def _wait_and_finish(
        self, run: Running, box: Sandbox | ContainerSandbox, *, timeout_s: float, ran_before_s: float = 0.0
    ) -> None:
        run.waiting = True
        outcome = await box.wait(timeout_s=timeout_s)
        run.waiting = False
        outcome = dataclasses.replace(outcome, duration_s=outcome.duration_s + ran_before_s)
        await self._revoke(run, cancel_in_flight=bool(outcome.killed))
        await self._finish(run, box, outcome)

    @property
    def forward_path(self) -> str:
        return urllib.parse.urlsplit(self.settings.proxy_base_url).path.rstrip("/")

    async def _finish(self, run: Running, box: Sandbox | ContainerSandbox, outcome: Outcome) -> None:
        launch = run.launch
        uri = box.work.as_uri()
        failed, last = run.failed_calls
        blamed = blame(
            HostFacts(
                started=outcome.started,
                setup_errno=outcome.setup_errno,
                setup_error=outcome.setup_error,
                killed=outcome.killed,
                exit_code=outcome.exit_code,
                proxy_failed_calls=failed,
                last_proxy_failure=last,
            )
        )
        if blamed.verdict == CANCELLED:
            await self._end(run, "cancelled", _cancelled(run, box))
        elif blamed.infrastructure:
            if not outcome.started:  # set-up's own messages: for the operator, never the verdict
                setup_log = await box.log_tail(1500, name="sandbox.log")
                raise LaunchFailed(blamed.kind, f"{blamed.reason}\n{setup_log}".strip())
            tail = (await box.log_tail(800)).strip()
            reason = f"{blamed.reason}; last output: {tail}" if tail else blamed.reason
            await self._end_failed(run, blamed.kind, reason, exit_code=outcome.exit_code)
        elif outcome.killed == "deadline" or (
            outcome.killed == "" and spent_own_budget(launch.harness, outcome.exit_code)
        ):
            # The wall-clock deadline, or the harness's own budget (its turns) spent before it
            # declared the work done: either way the policy ran out of time, not the infrastructure.
            event: Any = events_pb2.ExecutionTimedOut(
                execution=execution_ref(launch),
                workspace_uri=uri,
                timeout_s=launch.timeout_s,
                family=launch.family,
                task=launch.task,
                limit=events_pb2.TIMEOUT_LIMIT_DEADLINE
                if outcome.killed
                else events_pb2.TIMEOUT_LIMIT_HARNESS_BUDGET,
            )
            log.info("execution_out_of_time", by="deadline" if outcome.killed else "harness_budget")
            await self._end(run, "timed_out", event)
        elif outcome.killed == "" and outcome.exit_code == 0:
            event = events_pb2.ExecutionFinished(
                execution=execution_ref(launch),
                exit_code=0,
                workspace_uri=uri,
                duration_s=outcome.duration_s,
                family=launch.family,
                task=launch.task,
            )
            await self._end(run, "finished", event, exit_code=0)
        else:  # its own crash (non-zero exit, a signal we did not send, the disk quota): graded
            reason = crash_reason(outcome, await box.log_tail(1000))
            await self._end_failed(run, "harness_crashed", reason, exit_code=outcome.exit_code)

    async def _end(self, run: Running, state: str, event: Any, **values: Any) -> None:
        await self._count_calls(run, event)
        await self._commit(run.launch, event, state=state, ended_at=datetime.now(UTC), **values)
        log.info("execution_ended", state=state)

    async def _end_failed(
        self, run: Running, kind: str, reason: str, *, exit_code: int | None = None
    ) -> None:
        launch = run.launch
        uri = run.box.work.as_uri() if run.box is not None else ""
        event = events_pb2.ExecutionFailed(
            execution=execution_ref(launch),
            failure=runner_pb2.ExecutionFailure(kind=FAILURE_VALUES[kind], reason=reason[:4096]),
            workspace_uri=uri,
            family=launch.family,
            task=launch.task,
            exit_code=exit_code,
        )
        await self._count_calls(run, event)
        await self._commit(
            launch,
            event,
            state="failed",
            ended_at=datetime.now(UTC),
            failure_kind=kind,
            failure_reason=reason[:4096],
            workspace_uri=uri,
            exit_code=exit_code,
        )
        log.warning("execution_failed", kind=kind, reason=reason[:300])

    async def _commit(self, launch: Launch, payload: Any, **values: Any) -> None:
        envelope = new_event(
            payload, producer=PRODUCER, correlation_id=launch.task_id, causation_id=launch.request_id
        )
        for attempt in range(COMMIT_TRIES):  # at most 5 s apart: half a day of outage
            try:
                async with self.sessions() as session, session.begin():
                    await repo.update_execution(session, launch.execution_id, **values)
                    await enqueue(session, repo.outbox, envelope)
                break
            except Exception as exc:  # Postgres away (restarting): the end must still land
                if not is_outage(exc):  # an outage is waited out, however long
                    raise
                log.warning("state_commit_failed", error=type(exc).__name__, attempt=attempt)
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
        self.relay.poke()

    async def _register(self, launch: Launch, token: str, *, expires_at: datetime) -> None:
        if self.proxy is None:
            return
        request = proxy_pb2.RegisterExecutionTokenRequest(
            request_id=f"register:{launch.execution_id}", token=token, execution=execution_ref(launch)
        )
        request.min_policy_version.steps = launch.min_policy_version
        request.expires_at.FromDatetime(expires_at)
        try:
            await self.proxy.RegisterExecutionToken(request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise LaunchFailed(
                "proxy", f"proxy refused the execution token: {exc.code().name}: {exc.details()}"
            ) from exc

    async def _revoke(self, run: Running, *, cancel_in_flight: bool) -> None:
        """Revoke the token and learn how many calls the proxy recorded (retried while it is away)."""
        if self.proxy is None:
            return
        eid = run.launch.execution_id
        request = proxy_pb2.RevokeExecutionTokenRequest(
            request_id=f"revoke:{eid}", execution_id=eid, cancel_in_flight=cancel_in_flight
        )
        retry_s = self.settings.revoke_retry_s if run.revoke_retry_s is None else run.revoke_retry_s
        deadline = time.monotonic() + retry_s
        for attempt in range(10_000):  # bounded by the deadline
            try:
                answer = await self.proxy.RevokeExecutionToken(request, timeout=60)
                run.num_calls = answer.num_calls_recorded
                run.failed_calls = (answer.num_calls_failed_by_proxy, answer.last_call_failure)
                return
            except grpc.aio.AioRpcError as exc:
                retry = exc.code() in RETRIED_CODES and time.monotonic() < deadline
                log.warning(
                    "token_revoke_failed", code=exc.code().name, details=exc.details(), retrying=retry
                )
                if not retry:  # the token expires on its own; the end event goes without a count
                    return
                await asyncio.sleep(min(0.5 * 2**attempt, 10.0))

    async def _count_calls(self, run: Running, event: Any) -> None:
        """Put the proxy's count of recorded calls on an end event, when it can be known."""
        if run.num_calls is None and run.registered:
            await self._revoke(run, cancel_in_flight=True)
        if run.num_calls is None and not run.registered and self.proxy is not None:
            run.num_calls = 0  # no token, no call
        if run.num_calls is not None:
            event.num_calls_recorded = run.num_calls

    async def cancel(self, execution_id: str, *, reason: str, request_id: str) -> None:
        """Kill a running execution; it ends as cancelled with its workspace kept."""
        run = self.running.get(execution_id)
        if run is None:
            return
        run.cancel = (reason, request_id)
        if run.box is not None and run.box.proc is not None:
            await run.box.kill("cancelled")
        await asyncio.wait({run.task}, timeout=30)

    async def wait_started(self, execution_id: str) -> None:
        run = self.running.get(execution_id)
        if run is not None:
            await asyncio.wait({run.started}, timeout=self.settings.start_wait_s)

    async def recover(self) -> int:
        """Take back what a previous runner process left (DESIGN section 9): an execution still
        running in its sandbox is re-attached (waited for, ended and graded as usual, its harness
        never noticed); one left starting, or whose sandbox is gone, ends as failed: runner lost;
        an ended one's sandbox waits for its grade again. Every other sandbox is swept.
        Returns how many executions ended as lost."""
        async with self.sessions() as session:
            rows = await repo.unfinished(session)
            ended = await repo.ended_since(session, self.settings.keep_workspace_s)
        keep: set[str] = set()
        lost = 0
        for row in rows:
            launch = recovered_launch(row)
            box: Sandbox | ContainerSandbox | None
            if launch.family in CONTAINER_FAMILIES:
                box = await adopt_running(self.settings, launch.execution_id, self.containers, self.forward)
            else:
                box = adopt(self.host, launch.execution_id, self.settings.limits())
            if row.state == "running" and box is not None and row.deadline is not None:
                keep.add(box.path.name)
                left_s = (row.deadline - datetime.now(UTC)).total_seconds()
                ran_s = (datetime.now(UTC) - (row.started_at or datetime.now(UTC))).total_seconds()
                self.start(
                    launch, reattach=functools.partial(self._reattach, box=box, left_s=left_s, ran_s=ran_s)
                )
                continue
            run = Running(launch=launch, task=None, started=asyncio.get_running_loop().create_future())  # type: ignore[arg-type]
            run.registered = True  # it may have been: revoking answers the count either way
            run.revoke_retry_s = min(RECOVER_REVOKE_RETRY_S, self.settings.revoke_retry_s)  # start-up waits
            gone = "and its sandbox or container was gone" if row.state == "running" else "before it started"
            await self._end_failed(run, "runner_lost", f"the runner restarted {gone}")
            lost += 1
        for row in ended:
            eid = str(row.execution_id)
            box = adopt(self.host, eid, self.settings.limits()) or adopt_container(
                self.settings.sandbox_root, eid, self.containers
            )
            if box is not None:
                keep.add(box.path.name)
                age_s = (datetime.now(UTC) - row.ended_at).total_seconds()
                self.ended[str(row.execution_id)] = (box, time.monotonic() - age_s)
        await asyncio.to_thread(self.host.sweep, keep=frozenset(keep))
        await sweep_containers(self.containers, self.settings.sandbox_root, keep=frozenset(keep))
        return lost

    async def _reattach(
        self, run: Running, *, box: Sandbox | ContainerSandbox, left_s: float, ran_s: float
    ) -> None:
        run.box, run.registered = box, True
        run.started.set_result(None)
        alive = box.keeper_alive() if isinstance(box, Sandbox) else True
        log.info("execution_reattached", left_s=round(left_s, 1), keeper_alive=alive)
        await self._wait_and_finish(run, box, timeout_s=max(left_s, 0.0), ran_before_s=ran_s)

    async def run(self, stop: asyncio.Event) -> None:
        """Worker: release sandboxes once graded (`release`, from RewardAssigned) or at the latest
        `keep_workspace_s` after their end; on shutdown hand what runs to its keeper and keep every
        sandbox (`_shut_down`), as a crash (kill -9) does: the next runner re-attaches (`recover`)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=REAP_EVERY_S)
            cutoff = time.monotonic() - self.settings.keep_workspace_s
            for eid, (_, ended_at) in list(self.ended.items()):
                if ended_at < cutoff:
                    await self.release(eid)
        await self._shut_down()

    async def _shut_down(self) -> None:
        """A graceful stop (`gyre restart runner`, a deploy) leaves executions alone, as a crash
        does: running harnesses stay with their keepers and every sandbox stays, ended ones too
        (their grades may still come); the next runner re-attaches to them (`recover`), and
        `gyre down` sweeps what a stopped stack leaves. Killing here would fail executions an
        operator never meant to touch and burn their groups' retries.

        Launches under way get a few seconds to reach their harness and ends under way to
        commit; one that cannot is cancelled with the process and ends as runner lost at the next
        start, as after a crash. An execution still waiting for a slot is not started (a stopping
        runner starts no new work): it ends as runner lost, now or at the next start."""
        self.stopping = True
        deadline = time.monotonic() + SHUTDOWN_WAIT_S
        while time.monotonic() < deadline:
            busy = {r.task for r in self.running.values() if r.in_slot and not r.waiting}
            if not busy:
                break
            await asyncio.wait(busy, timeout=min(0.2, max(deadline - time.monotonic(), 0.0)))
        handed = [r for r in self.running.values() if r.waiting]
        for run in handed:
            run.task.cancel()  # this process stops watching it (the keeper runs on); the next runner does
        await asyncio.gather(*(r.task for r in handed), return_exceptions=True)
        log.info("runner_stopped_leaving_executions", handed_over=len(handed), kept_ended=len(self.ended))

    async def release(self, execution_id: str) -> None:
        """Drop an ended execution's sandbox (its workspace too): after grading, or in tests."""
        entry = self.ended.pop(execution_id, None)
        if entry is not None:
            await entry[0].release()


def _cancelled(run: Running, box: Sandbox | ContainerSandbox) -> events_pb2.ExecutionCancelled:
    reason, request_id = run.cancel or ("", "")
    return events_pb2.ExecutionCancelled(
        execution=execution_ref(run.launch),
        reason=reason,
        workspace_uri=box.work.as_uri(),
        request_id=request_id,
        family=run.launch.family,
        task=run.launch.task,
    )


def _forward(base_url: str) -> Forward:
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise GyreError(f"GYRE_RUNNER_PROXY_BASE_URL must be http://host:port[/path], got {base_url!r}")
    return Forward(host=parts.hostname, port=parts.port or 80)
