"""`GyreClient`: submit, watch, query and cancel over the services' public gRPC APIs (shell: grpc).

The `gyre` command is built on it, and pipelines can embed it:

    async with GyreClient(ServiceAddresses.resolve()) as gyre:
        [task] = await gyre.submit([TaskSpec(name="t", family="repo_repair", prompt="...",
                                             group_size=4, timeout_s=600, harness="gyre-agent")])
        async for progress in gyre.watch([task.task_id], timeout_s=3600):
            print(progress.task_id, progress.state, progress.num_rewarded)

Errors are the kernel's: `NotFound` (an unknown id), `InvalidArgument` (bad input, the field
named), `Conflict`, `Unavailable` (a service that cannot be reached: which one, where, and how to
start it), and `RpcNotServed` for an RPC the running service does not offer yet.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from google.protobuf import message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.errors import Conflict, GyreError, InvalidArgument, NotFound, Unavailable
from gyre.outages import DEPENDENCY_AWAY
from gyre.rpc import ERROR_FIELD_TRAILER, MAX_MESSAGE_BYTES
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.tls import aio_channel
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from gyre_app.client.addresses import ServiceAddresses, how_to_start

T = TypeVar("T")
TaskSpec = scheduler_pb2.TaskSpec
Task = scheduler_pb2.Task
ENDED_TASK = scheduler_pb2.TASK_STATE_DONE
MAX_PAGE_SIZE = 1000  # the scheduler's ListTasks limit


class RpcNotServed(GyreError):
    """The service runs but does not offer this RPC (yet): said plainly, never faked."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskProgress:
    """One task as `watch` sees it: the scheduler's state and the rewards the trajectory service holds."""

    task_id: str
    state: str
    """`pending`, `running` or `done` (every execution ended)."""
    group_size: int
    num_rewarded: int
    ready: bool
    """Every execution rewarded: the group can be trained."""
    rewards: tuple[float | None, ...]
    """Per member, replacements included; None until rewarded, and for an infrastructure failure
    (never a reward of 0: it is out of the baseline)."""
    num_unassessable: int = 0
    """Members whose grade was not assessable (infrastructure failures)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskPage:
    """One page of `list_tasks`."""

    tasks: list[Task]
    next_page_token: str
    """Empty on the last page."""


def task_state(name: str) -> scheduler_pb2.TaskState.ValueType:
    """A task state by its name (`pending`, `trained`...); empty: every state (UNSPECIFIED)."""
    if not name:
        return scheduler_pb2.TASK_STATE_UNSPECIFIED
    known = [n.removeprefix("TASK_STATE_").lower() for n in scheduler_pb2.TaskState.keys()[1:]]
    if name.lower() not in known:
        raise InvalidArgument("state", f"unknown task state {name!r}; known: {', '.join(known)}")
    return scheduler_pb2.TaskState.Value(f"TASK_STATE_{name.upper()}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionDetail:
    """One execution: the runner's record and, once it made calls, its tree."""

    execution: runner_pb2.Execution
    tree: trajectory_pb2.ExecutionTree | None


def _translate(service: str, address: str, exc: grpc.aio.AioRpcError) -> GyreError:
    code, details = exc.code(), exc.details() or ""
    if (
        code == grpc.StatusCode.UNAVAILABLE and DEPENDENCY_AWAY in details
    ):  # it runs; its database or bus does not
        return Unavailable(f"the {service} service at {address} runs, but {DEPENDENCY_AWAY}")
    if code == grpc.StatusCode.UNAVAILABLE:
        return Unavailable(f"the {service} service at {address} is not reachable: {how_to_start(service)}")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return Unavailable(f"the {service} service at {address} did not answer in time")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFound(details)
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        trailers: Any = exc.trailing_metadata() or ()
        field = next((str(m[1]) for m in trailers if m[0] == ERROR_FIELD_TRAILER), "")
        problem = details.removeprefix(f"{field}: ") if field else details
        return InvalidArgument(field or "request", problem)
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        return Conflict(details)
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return RpcNotServed(f"the {service} service at {address} does not serve this RPC: {details}")
    return GyreError(f"{service} answered {code.name}: {details}")


class GyreClient:
    """Async client of the scheduler, runner, trajectory and trainer APIs; one channel per service."""

    def __init__(self, addresses: ServiceAddresses | None = None, *, timeout_s: float = 10.0) -> None:
        self.addresses = addresses or ServiceAddresses.resolve()
        self.timeout_s = timeout_s
        self._channels: dict[str, grpc.aio.Channel] = {}

    async def __aenter__(self) -> GyreClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close(None)
        self._channels.clear()

    def _channel(self, service: str) -> grpc.aio.Channel:
        if service not in self._channels:
            self._channels[service] = aio_channel(
                self.addresses.of(service),
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],  # packed samples
            )
        return self._channels[service]

    async def _call(self, service: str, call: Callable[[grpc.aio.Channel], Awaitable[T]]) -> T:
        channel = self._channel(service)
        try:
            return await call(channel)
        except grpc.aio.AioRpcError as exc:
            raise _translate(service, self.addresses.of(service), exc) from None

    # --- scheduler -------------------------------------------------------------------------

    def _scheduler(self, channel: grpc.aio.Channel) -> scheduler_pb2_grpc.SchedulerServiceAsyncStub:
        return scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[return-value]

    async def submit(self, specs: Sequence[TaskSpec], *, request_id: str | None = None) -> list[Task]:
        """Submit tasks atomically; a repeat with the same `request_id` returns the first answer."""
        request = scheduler_pb2.SubmitTasksRequest(
            request_id=request_id or f"gyre-{uuid.uuid4().hex}", tasks=list(specs)
        )
        response = await self._call(
            "scheduler", lambda c: self._scheduler(c).SubmitTasks(request, timeout=self.timeout_s)
        )
        return list(response.tasks)

    async def get_task(self, task_id: str) -> Task:
        request = scheduler_pb2.GetTaskRequest(task_id=task_id)
        response = await self._call(
            "scheduler", lambda c: self._scheduler(c).GetTask(request, timeout=self.timeout_s)
        )
        return response.task

    @staticmethod
    def _scheduler_serves(name: str) -> bool:
        return name in scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].methods_by_name

    def _unbuilt(self, name: str, purpose: str) -> RpcNotServed:
        """Why `purpose` cannot be done: the scheduler contract lacks `name` (issue 12 adds some of
        them), or this client does not use it yet."""
        if self._scheduler_serves(name):
            return RpcNotServed(
                f"{purpose}: the scheduler offers {name}, but this client does not use it yet"
            )
        return RpcNotServed(
            f"{purpose} needs the scheduler's {name} RPC, which this scheduler contract does not have yet"
        )

    async def list_tasks(self, *, state: str = "", page_size: int = 0, page_token: str = "") -> TaskPage:
        """One page of tasks, oldest first (`ListTasks`); `state` a name such as `pending`, empty
        for every state. Pass the page's `next_page_token` back, with the same state, for the next."""
        response = await self._scheduler_rpc(
            "ListTasks",
            "listing tasks",
            state=task_state(state),
            page_size=page_size,
            page_token=page_token,
        )
        return TaskPage(tasks=list(response.tasks), next_page_token=response.next_page_token)

    async def all_tasks(self, *, state: str = "", limit: int = 0, page_token: str = "") -> TaskPage:
        """Tasks page by page, oldest first (after `page_token`), until the last or `limit` (0: none);
        `next_page_token` is where to go on when `limit` stopped it."""
        tasks: list[Task] = []
        token = page_token
        while True:  # bounded: each page moves past the previous page's last task
            want = min(MAX_PAGE_SIZE, limit - len(tasks)) if limit else MAX_PAGE_SIZE
            page = await self.list_tasks(state=state, page_size=want, page_token=token)
            tasks += page.tasks
            token = page.next_page_token
            if not token or (limit and len(tasks) >= limit):
                return TaskPage(tasks=tasks, next_page_token=token)

    async def _scheduler_rpc(self, name: str, purpose: str, **fields: Any) -> Any:
        """Call a scheduler RPC that not every contract version has (issue 12 adds them): by name,
        its request built from `fields`; `RpcNotServed` when this contract lacks it."""
        if not self._scheduler_serves(name):
            raise self._unbuilt(name, purpose)
        request = getattr(scheduler_pb2, f"{name}Request")(**fields)
        return await self._call(
            "scheduler", lambda c: getattr(self._scheduler(c), name)(request, timeout=self.timeout_s)
        )

    async def list_executions(self, *, task_id: str = "", limit: int = 0) -> list[Any]:
        """The scheduler's executions with their states (`ListExecutions`), oldest task first."""
        response = await self._scheduler_rpc(
            "ListExecutions", "listing executions", task_id=task_id, limit=limit
        )
        return list(response.executions)

    async def cancel_task(self, task_id: str, *, reason: str = "", request_id: str | None = None) -> Any:
        """Cancel a whole task (`CancelTask`): unstarted executions never start, running ones stop."""
        return await self._scheduler_rpc(
            "CancelTask",
            f"cancelling task {task_id}",
            request_id=request_id or f"gyre-cancel-{uuid.uuid4().hex}",
            task_id=task_id,
            reason=reason,
        )

    async def cells(self) -> message.Message:
        """The scheduler's cells and mode (`GetCells`), where the scheduler serves it."""
        response: message.Message = await self._scheduler_rpc("GetCells", "showing cells")
        return response

    async def set_mode(self, mode: str, *, request_id: str | None = None) -> Any:
        """Set the scheduling mode (`SetMode`; while a step runs it waits for the step's end)."""
        return await self._scheduler_rpc(
            "SetMode",
            f"setting the mode to {mode}",
            request_id=request_id or f"gyre-mode-{uuid.uuid4().hex}",
            mode=scheduler_pb2.SchedulingMode.Value(f"SCHEDULING_MODE_{mode.upper()}"),
        )

    async def switch_cell(self, cell_id: str, role: str, *, request_id: str | None = None) -> Any:
        """Switch one satellite to `rollout` or `training` (`SwitchCell`); returns when it ended."""
        return await self._scheduler_rpc(
            "SwitchCell",
            f"switching {cell_id} to {role}",
            request_id=request_id or f"gyre-switch-{uuid.uuid4().hex}",
            cell_id=cell_id,
            role=scheduler_pb2.CellRole.Value(f"CELL_ROLE_{role.upper()}"),
        )

    # --- runner ----------------------------------------------------------------------------

    async def runner_execution(self, execution_id: str) -> runner_pb2.Execution:
        request = runner_pb2.GetExecutionRequest(execution_id=execution_id)
        response = await self._call(
            "runner",
            lambda c: runner_pb2_grpc.RunnerServiceStub(c).GetExecution(request, timeout=self.timeout_s),
        )
        return response.execution

    async def get_execution(self, execution_id: str) -> ExecutionDetail:
        execution = await self.runner_execution(execution_id)
        try:
            tree: trajectory_pb2.ExecutionTree | None = await self.execution_tree(execution_id)
        except NotFound:  # no call recorded (yet)
            tree = None
        return ExecutionDetail(execution=execution, tree=tree)

    async def cancel_execution(
        self, execution_id: str, *, reason: str = "", request_id: str | None = None
    ) -> runner_pb2.Execution:
        """Kill the execution's harness (its workspace is kept); an ended one is returned as it is."""
        request = runner_pb2.CancelExecutionRequest(
            request_id=request_id or f"gyre-cancel-{uuid.uuid4().hex}",
            execution_id=execution_id,
            reason=reason,
        )
        response = await self._call(
            "runner",
            lambda c: runner_pb2_grpc.RunnerServiceStub(c).CancelExecution(request, timeout=self.timeout_s),
        )
        return response.execution

    # --- trajectory ------------------------------------------------------------------------

    def _trajectory(self, channel: grpc.aio.Channel) -> trajectory_pb2_grpc.TrajectoryServiceAsyncStub:
        return trajectory_pb2_grpc.TrajectoryServiceStub(channel)  # type: ignore[return-value]

    async def group(self, task_id: str) -> trajectory_pb2.Group:
        request = trajectory_pb2.GetGroupRequest(task_id=task_id)
        response = await self._call(
            "trajectory", lambda c: self._trajectory(c).GetGroup(request, timeout=self.timeout_s)
        )
        return response.group

    async def execution_tree(self, execution_id: str, *, j_max: int = 0) -> trajectory_pb2.ExecutionTree:
        request = trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id, j_max=j_max)
        response = await self._call(
            "trajectory", lambda c: self._trajectory(c).GetExecutionTree(request, timeout=self.timeout_s)
        )
        return response.tree

    async def call(self, call_id: str) -> trajectory_pb2.GetCallResponse:
        request = trajectory_pb2.GetCallRequest(call_id=call_id)
        return await self._call(
            "trajectory", lambda c: self._trajectory(c).GetCall(request, timeout=self.timeout_s)
        )

    async def stream_samples(
        self, request: trajectory_pb2.StreamSamplesRequest, *, timeout_s: float = 120.0
    ) -> list[trajectory_pb2.StreamSamplesResponse]:
        """Replay executions or groups into loss-weighted samples: the service's responses in order,
        one sample each or packed arrays (`request.encoding`)."""

        async def stream(c: grpc.aio.Channel) -> list[trajectory_pb2.StreamSamplesResponse]:
            return [r async for r in self._trajectory(c).StreamSamples(request, timeout=timeout_s)]

        return await self._call("trajectory", stream)

    # --- trainer ---------------------------------------------------------------------------

    def _trainer(self, channel: grpc.aio.Channel) -> trainer_pb2_grpc.TrainerServiceAsyncStub:
        return trainer_pb2_grpc.TrainerServiceStub(channel)  # type: ignore[return-value]

    async def trainer_status(self) -> trainer_pb2.GetStatusResponse:
        request = trainer_pb2.GetStatusRequest()
        return await self._call(
            "trainer", lambda c: self._trainer(c).GetStatus(request, timeout=self.timeout_s)
        )

    async def step(self, version: int) -> trainer_pb2.Step:
        """A completed step as the trainer recorded it; `NotFound` for a step never trained."""
        request = trainer_pb2.GetStepRequest()
        request.version.steps = version
        response = await self._call(
            "trainer", lambda c: self._trainer(c).GetStep(request, timeout=self.timeout_s)
        )
        return response.step

    # --- any service -----------------------------------------------------------------------

    async def health(self, service: str) -> str:
        """`serving`, `not serving`, `unreachable` or `unknown address`, for people."""
        try:
            address = self.addresses.of(service)
        except Unavailable:
            return "unknown address"
        try:
            answer = await health_pb2_grpc.HealthStub(self._channel(service)).Check(
                health_pb2.HealthCheckRequest(), timeout=min(self.timeout_s, 2.0)
            )
        except grpc.aio.AioRpcError:
            return f"unreachable at {address}"
        serving = answer.status == health_pb2.HealthCheckResponse.SERVING
        return f"serving at {address}" if serving else f"not serving at {address}"

    async def progress(self, task_id: str) -> TaskProgress:
        task = await self.get_task(task_id)
        try:
            group: trajectory_pb2.Group | None = await self.group(task_id)
        except NotFound:  # the trajectory service has not consumed TaskSubmitted yet
            group = None
        members = group.executions if group is not None else ()
        rewards = tuple((e.reward if e.has_reward and e.assessable else None) for e in members)
        return TaskProgress(
            task_id=task_id,
            state=scheduler_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower(),
            group_size=task.spec.group_size,
            num_rewarded=sum(e.has_reward for e in members),
            ready=bool(group is not None and group.ready),
            rewards=rewards,
            num_unassessable=group.num_unassessable if group is not None else 0,
        )

    async def watch(
        self, task_ids: Sequence[str], *, poll_s: float = 1.0, timeout_s: float = 3600.0
    ) -> AsyncIterator[TaskProgress]:
        """Yield a task's progress each time it changes, until every task's group is ready.

        Polls the public APIs (GetTask, GetGroup); raises `Unavailable` when `timeout_s` passes first.
        """
        last: dict[str, TaskProgress] = {}
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            for task_id in task_ids:
                now = await self.progress(task_id)
                if last.get(task_id) != now:
                    last[task_id] = now
                    yield now
            if all(p.ready for p in last.values()) and len(last) == len(task_ids):
                return
            if asyncio.get_running_loop().time() > deadline:
                waiting = [t for t in task_ids if not last[t].ready]
                raise Unavailable(
                    f"{len(waiting)} task(s) not ready after {timeout_s:.0f} s: {', '.join(waiting)}"
                )
            await asyncio.sleep(poll_s)
