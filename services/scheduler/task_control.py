"""ListExecutions and CancelTask (shell: validate -> tables -> the runner for running harnesses).

CancelTask works on a task in any state (the liveness rule, `policy.liveness`): before its
rollout ended its harnesses are stopped; after (`done`, `graded`: the group waits to be ready or
trained) the group is withdrawn from the trainer by `TaskCancelled`, and in either case it
leaves its step, which the driver gives another group (the live facts skip cancelled tasks). A
trained, set-aside or cancelled task is answered as it is: there is nothing left to stop.
"""

from __future__ import annotations

import uuid

import grpc
import sqlalchemy as sa
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.common.v1 import ids_pb2
from gyre.errors import InvalidArgument, NotFound, Unavailable
from gyre.ids import require_uuid
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.scheduler.v1 import events_pb2
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.tls import aio_channel
from services.scheduler import repo

MAX_LIST = 10000
CANCELLABLE = ("pending", "admitted", "running")
"""Execution states a cancel stops (or keeps from starting)."""
ENDED_ROLLOUT = ("done", "graded")
"""Task states whose executions all ended: the group waits for readiness or for its step."""


def execution_state(name: str) -> pb.ExecutionState.ValueType:
    return pb.ExecutionState.Value(f"EXECUTION_STATE_{name.upper()}")


async def list_executions(
    sessions: async_sessionmaker[AsyncSession], request: pb.ListExecutionsRequest
) -> pb.ListExecutionsResponse:
    if request.task_id:
        require_uuid("task_id", request.task_id, what="a task")
    if request.state and request.state not in pb.ExecutionState.values():
        raise InvalidArgument("state", f"unknown execution state {request.state}")
    if request.limit > MAX_LIST:
        raise InvalidArgument("limit", f"must be at most {MAX_LIST}, got {request.limit}")
    t, e = repo.tasks.c, repo.executions.c
    successor = repo.executions.alias("successor")
    replaced_by = (
        sa.select(successor.c.execution_id).where(successor.c.replaces == e.execution_id).scalar_subquery()
    )
    stmt = (
        sa.select(
            e.execution_id,
            e.task_id,
            e.index_in_group,
            e.state,
            e.duration_s,
            e.replaces,
            e.failure_reason,
            replaced_by.label("replaced_by"),
            t.admitted_version,
        )
        .join(repo.tasks, t.task_id == e.task_id)
        .order_by(t.seq, e.index_in_group)
        .limit(request.limit or 1000)
    )
    if request.task_id:
        stmt = stmt.where(e.task_id == uuid.UUID(request.task_id))
    if request.state:
        name = pb.ExecutionState.Name(request.state).removeprefix("EXECUTION_STATE_").lower()
        stmt = stmt.where(e.state == name)
    async with sessions() as session:
        if request.task_id and not await session.scalar(
            sa.select(t.task_id).where(t.task_id == uuid.UUID(request.task_id))
        ):
            raise NotFound(f"task_id: task {request.task_id} does not exist")
        rows = (await session.execute(stmt)).all()
    out = pb.ListExecutionsResponse()
    for row in rows:
        item = out.executions.add(
            execution=ids_pb2.ExecutionRef(
                task_id=str(row.task_id),
                execution_id=str(row.execution_id),
                index_in_group=row.index_in_group,
            ),
            state=execution_state(row.state),
            failure_reason=row.failure_reason or "",
            replaced_by=str(row.replaced_by or ""),
            replaces=str(row.replaces or ""),
        )
        if row.admitted_version is not None:
            item.admitted_version = row.admitted_version
        if row.duration_s is not None:
            item.duration_s = row.duration_s
    return out


async def cancel_task(
    session: AsyncSession, request: pb.CancelTaskRequest, *, runner_address: str
) -> tuple[pb.CancelTaskResponse, list[Message]]:
    """Cancel in the caller's transaction; running harnesses are stopped through the runner first.
    Returns the answer and the events to publish with it."""
    require_uuid("task_id", request.task_id, what="a task")
    key = uuid.UUID(request.task_id)
    t, e = repo.tasks.c, repo.executions.c
    # The executions' rows before the task's, in the order the lifecycle consumer takes them (a
    # runner event moves an execution, then its task): the other order deadlocked with it.
    rows = (
        await session.execute(
            sa.select(e.execution_id, e.state)
            .where(e.task_id == key)
            .order_by(e.execution_id)
            .with_for_update()
        )
    ).all()
    state = await session.scalar(sa.select(t.state).where(t.task_id == key).with_for_update())
    if state is None:
        raise NotFound(f"task_id: task {request.task_id} does not exist")
    answer = pb.CancelTaskResponse(previous_state=pb.TaskState.Value(f"TASK_STATE_{state.upper()}"))
    if state not in (*CANCELLABLE, *ENDED_ROLLOUT):
        return answer, []  # trained, set aside or cancelled already: nothing to stop, nothing waits
    unscheduled = [r.execution_id for r in rows if r.state == "pending"]
    scheduled = [r.execution_id for r in rows if r.state in ("admitted", "running")]
    if scheduled:
        if not runner_address:
            raise Unavailable(
                "the scheduler has no runner address (GYRE_SCHEDULER_RUNNER_ADDRESS) to stop harnesses"
            )
        async with aio_channel(runner_address) as channel:
            runner = runner_pb2_grpc.RunnerServiceStub(channel)
            for execution_id in scheduled:
                try:
                    await runner.CancelExecution(  # type: ignore[misc]
                        runner_pb2.CancelExecutionRequest(
                            request_id=f"{request.request_id}:{execution_id}",
                            execution_id=str(execution_id),
                            reason=request.reason or "task cancelled",
                        ),
                        timeout=30,
                    )
                except grpc.aio.AioRpcError as exc:
                    # One the runner has not taken up yet is cancelled there before it starts:
                    # when its ExecutionScheduled comes, it ends cancelled, never started.
                    raise Unavailable(f"runner: {exc.code().name} {exc.details()}") from None
    await session.execute(sa.update(repo.tasks).where(t.task_id == key).values(state="cancelled"))
    await session.execute(
        sa.update(repo.executions).where(e.task_id == key, e.state.in_(CANCELLABLE)).values(state="cancelled")
    )
    answer.num_executions_unscheduled = len(unscheduled)
    answer.num_executions_stopped = len(scheduled)
    # Whatever its state, a group of a cancelled task may still become ready (grades of ended
    # executions are on their way): the trainer must never train it.
    withdrawn = events_pb2.TaskCancelled(
        task_id=request.task_id, reason=request.reason or "task cancelled", previous_state=state
    )
    return answer, [withdrawn]
