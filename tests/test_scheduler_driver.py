"""The live driver on real NATS and Postgres: tasks are admitted only within the policy's staleness
cap, states follow the runner's, evaluator's, trajectory's and trainer's events, a trained step
lets the next task in, and CancelTask / ListExecutions answer with the states (bad ids refused)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta

import grpc
import pytest
import pytest_asyncio
from scheduler_rig import Rig, driver_rig, run_to_trained, spec, step_completed, submit, until
from trainer_stack import events_on_bus

from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trajectory.v1 import events_pb2 as trajectory_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    async with driver_rig(server_urls, tmp_path_factory.mktemp("driver")) as r:
        yield r


def count(states: list[tuple[str, str]], state: str) -> int:
    return sum(1 for _, s in states if s == f"EXECUTION_STATE_{state}")


async def test_admission_stays_within_the_staleness_cap_until_a_step_completes(rig: Rig) -> None:
    tasks = await submit(rig, 4)

    async def admitted(n: int) -> bool:
        states = await rig.states()
        return count(states, "ADMITTED") + count(states, "RUNNING") + count(states, "TRAINED") == n

    await until(lambda: admitted(2), "the cap (0 + K + 1) * B = 2 tasks admitted")
    await asyncio.sleep(0.6)  # several decisions later, still two: the cap holds
    assert count(await rig.states(), "PENDING") == 2
    states = await rig.states()
    first = next(t for t in tasks if (t.task_id, "EXECUTION_STATE_ADMITTED") in states)
    await run_to_trained(rig, first, version=1)
    await until(
        lambda: admitted(3),
        "one more task admitted once version 1 is trained",
    )
    assert (first.task_id, "EXECUTION_STATE_TRAINED") in await rig.states()
    task = (await rig.stub.GetTask(pb.GetTaskRequest(task_id=first.task_id))).task
    assert task.state == pb.TASK_STATE_TRAINED
    # Each ExecutionScheduled carries the version its task was admitted at: the proxy serves the
    # execution's calls from weights of that version or newer only.
    scheduled = await events_on_bus(rig.kernel, "scheduler", scheduler_events.ExecutionScheduled)
    versions = {e.execution.task_id: e.admitted_version.steps for e in scheduled}
    ids = {t.task_id for t in tasks}
    assert sorted(v for t, v in versions.items() if t in ids) == [0, 0, 1]


async def test_a_ready_group_is_assigned_to_the_running_step_and_the_trainer_told(rig: Rig) -> None:
    await rig.stub.SetMode(pb.SetModeRequest(request_id="gyre-again", mode=pb.SCHEDULING_MODE_GYRE))
    states = await rig.states()
    task_id = next(t for t, s in states if s == "EXECUTION_STATE_ADMITTED")
    listed = await rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=task_id))
    ref = listed.executions[0].execution
    await rig.publish(runner_events.ExecutionFinished(execution=ref, duration_s=2.0), "runner")
    await rig.publish(
        trajectory_events.GroupReady(task_id=task_id, execution_ids=[ref.execution_id]), "trajectory"
    )

    async def assigned() -> bool:
        events = await events_on_bus(rig.kernel, "scheduler", scheduler_events.StepAssigned)
        return any(list(e.task_ids) == [task_id] and e.step == 1 for e in events)

    await until(assigned, "StepAssigned for the ready group at step 1 (version 1)")
    # The step completes (a mode set later takes effect at once: no step runs).
    await step_completed(rig, [task_id], version=2)
    await until(lambda: trained(rig, task_id), "the step's group trained")


async def trained(rig: Rig, task_id: str) -> bool:
    return (task_id, "EXECUTION_STATE_TRAINED") in await rig.states()


async def test_a_queued_task_is_cancelled_and_never_scheduled(rig: Rig) -> None:
    await rig.stub.SetMode(pb.SetModeRequest(request_id="frozen", mode=pb.SCHEDULING_MODE_ASYNC))
    tasks = await submit(rig, 4)  # the cap is reached: they stay queued
    await until(lambda: _pending(rig, tasks[3].task_id), "the last task to be queued")
    answer = await rig.stub.CancelTask(pb.CancelTaskRequest(request_id="c-1", task_id=tasks[3].task_id))
    assert answer.previous_state == pb.TASK_STATE_PENDING and answer.num_executions_unscheduled == 1
    listed = await rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=tasks[3].task_id))
    assert [e.state for e in listed.executions] == [pb.EXECUTION_STATE_CANCELLED]
    # Cancelling works in any state: a cancelled task is answered as it is, nothing stopped again.
    again = await rig.stub.CancelTask(pb.CancelTaskRequest(request_id="c-2", task_id=tasks[3].task_id))
    assert again.previous_state == pb.TASK_STATE_CANCELLED
    assert (again.num_executions_unscheduled, again.num_executions_stopped) == (0, 0)


async def _pending(rig: Rig, task_id: str) -> bool:
    return (task_id, "EXECUTION_STATE_PENDING") in await rig.states()


async def test_a_past_deadline_is_refused_naming_the_field_and_nothing_is_stored(rig: Rig) -> None:
    before = await rig.states()
    late = spec("late")
    late.deadline.FromDatetime(datetime.now(UTC) - timedelta(minutes=1))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await rig.stub.SubmitTasks(pb.SubmitTasksRequest(request_id="late-1", tasks=[spec("ok"), late]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata() or ())["gyre-error-field"] == "tasks[1].deadline"  # type: ignore[arg-type]
    assert await rig.states() == before


async def test_a_silent_rollout_cell_is_lost_and_the_proxy_stops_routing_to_it(rig: Rig) -> None:
    await rig.stub.RegisterCell(
        pb.RegisterCellRequest(
            request_id="silent",
            cell_id="cell-9",
            slots=4,
            model_fingerprint="qwen2-tiny",
            engine_id="engine-9",
            engine_address="127.0.0.1:9",
            agent_address="127.0.0.1:10",
        )
    )

    async def unrouted() -> bool:
        routing = await rig.proxy.GetRouting(proxy_pb2.GetRoutingRequest())
        states = {r.cell_id: r.state for r in routing.routes}
        return states.get("cell-9") in (proxy_pb2.ROUTE_STATE_DRAINING, proxy_pb2.ROUTE_STATE_DRAINED)

    await until(unrouted, "the lost cell's route to stop taking calls")
    cells = {c.cell_id: c.role for c in (await rig.stub.GetCells(pb.GetCellsRequest())).cells}
    assert cells["cell-9"] == pb.CELL_ROLE_LOST and cells["cell-1"] == pb.CELL_ROLE_ROLLOUT


@pytest.mark.parametrize(
    ("call", "code"),
    [
        (lambda s: s.CancelTask(pb.CancelTaskRequest(request_id="x-1", task_id="nope")), "INVALID_ARGUMENT"),
        (
            lambda s: s.CancelTask(pb.CancelTaskRequest(request_id="x-2", task_id=str(uuid.uuid4()))),
            "NOT_FOUND",
        ),
        (lambda s: s.ListExecutions(pb.ListExecutionsRequest(task_id=str(uuid.uuid4()))), "NOT_FOUND"),
        (lambda s: s.ListExecutions(pb.ListExecutionsRequest(limit=10**6)), "INVALID_ARGUMENT"),
    ],
)
async def test_unknown_or_bad_task_ids_are_refused(rig: Rig, call: Callable[..., object], code: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call(rig.stub)  # type: ignore[misc]
    assert err.value.code().name == code


async def test_an_end_event_read_after_the_step_that_trained_it_still_records_the_length(rig: Rig) -> None:
    """The runner's and the trainer's events are consumed independently: a busy runner consumer may
    read an execution's end after StepCompleted trained its group (a CI run saw it)."""
    [task] = await submit(rig, 1)
    ref = task.executions[0]
    await rig.publish(runner_events.ExecutionStarted(execution=ref), "runner")
    await step_completed(rig, [task.task_id], version=1)  # a version already passed: the cluster stays
    await until(lambda: trained(rig, task.task_id), "the group trained before its end was read")
    await rig.publish(runner_events.ExecutionFinished(execution=ref, duration_s=3.5), "runner")

    async def length() -> float | None:
        [listed] = (await rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=task.task_id))).executions
        return listed.duration_s if listed.HasField("duration_s") else None

    await until(lambda: _is(length(), 3.5), "the late end event's length recorded")
    assert await trained(rig, task.task_id), "the state does not move back"


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected
