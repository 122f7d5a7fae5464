"""SetMode takes effect strictly between steps: asked while a step runs, the mode waits (no
ModeChanged, GetCells still shows the old one) until that step's StepCompleted; asked between
steps, at once. Real scheduler, NATS and Postgres; the other services' events are published."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from scheduler_rig import Rig, driver_rig, run_to_ready, step_completed, submit, until
from trainer_stack import events_on_bus

from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    async with driver_rig(server_urls, tmp_path_factory.mktemp("set-mode")) as r:
        yield r


async def mode(rig: Rig) -> pb.SchedulingMode.ValueType:
    return (await rig.stub.GetCells(pb.GetCellsRequest())).mode


async def mode_changes(rig: Rig, request_id: str) -> list[scheduler_events.ModeChanged]:
    events = await events_on_bus(rig.kernel, "scheduler", scheduler_events.ModeChanged)
    return [e for e in events if e.request_id == request_id]


async def published(rig: Rig, request_id: str) -> bool:
    return len(await mode_changes(rig, request_id)) == 1


async def test_a_mode_set_during_a_step_waits_for_its_end_and_one_set_between_steps_does_not(
    rig: Rig,
) -> None:
    await rig.stub.SetMode(pb.SetModeRequest(request_id="to-gyre", mode=pb.SCHEDULING_MODE_GYRE))
    assert await mode(rig) == pb.SCHEDULING_MODE_GYRE  # no step runs yet: at once
    await until(lambda: published(rig, "to-gyre"), "ModeChanged for the mode set between steps")
    (task,) = await submit(rig, 1)

    async def admitted() -> bool:
        listed = await rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=task.task_id))
        return listed.executions[0].state == pb.EXECUTION_STATE_ADMITTED

    await until(admitted, "the task to be admitted")
    await run_to_ready(rig, task)

    async def assigned() -> bool:
        events = await events_on_bus(rig.kernel, "scheduler", scheduler_events.StepAssigned)
        return any(list(e.task_ids) == [task.task_id] and e.step == 0 for e in events)

    await until(assigned, "the group assigned to step 0")
    answer = await rig.stub.SetMode(pb.SetModeRequest(request_id="to-burst", mode=pb.SCHEDULING_MODE_BURST))
    assert answer.previous_mode == pb.SCHEDULING_MODE_GYRE and answer.mode == pb.SCHEDULING_MODE_BURST
    await asyncio.sleep(0.6)  # several decisions later (ticks of 0.2 s), the step still runs: no change
    assert await mode(rig) == pb.SCHEDULING_MODE_GYRE
    assert await mode_changes(rig, "to-burst") == []
    await step_completed(rig, [task.task_id], version=1)

    async def burst() -> bool:
        return await mode(rig) == pb.SCHEDULING_MODE_BURST

    await until(burst, "the mode to change once step 0 completed")
    await until(lambda: published(rig, "to-burst"), "ModeChanged once the step completed")
    (changed,) = await mode_changes(rig, "to-burst")
    assert (changed.previous_mode, changed.mode) == (pb.SCHEDULING_MODE_GYRE, pb.SCHEDULING_MODE_BURST)
