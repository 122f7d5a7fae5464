"""A group the trainer sets aside leaves its step: the scheduler marks it (and its executions)
set aside and assigns another ready group to the same step. Before, the step kept waiting for
the set-aside group and no later group was ever assigned (seen by the fault suite in Gyre mode)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from scheduler_rig import Rig, driver_rig, run_to_ready, submit, until
from trainer_stack import events_on_bus

from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trainer.v1 import events_pb2 as trainer_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def rig(server_urls: tuple[str, str], tmp_path: Path) -> AsyncIterator[Rig]:
    async with driver_rig(server_urls, tmp_path) as r:
        yield r


async def assigned_to(rig: Rig, task_id: str, step: int) -> bool:
    events = await events_on_bus(rig.kernel, "scheduler", scheduler_events.StepAssigned)
    return any(task_id in e.task_ids and e.step == step for e in events)


async def test_a_set_aside_group_leaves_its_step_and_the_next_ready_group_takes_its_place(rig: Rig) -> None:
    tasks = await submit(rig, 3)

    async def admitted() -> list[pb.Task]:
        out = []
        for task in tasks:
            got = (await rig.stub.GetTask(pb.GetTaskRequest(task_id=task.task_id))).task
            if got.state == pb.TASK_STATE_ADMITTED:
                out.append(task)
        return out

    async def two_admitted() -> bool:
        return len(await admitted()) == 2

    await until(two_admitted, "the cap (0 + K + 1) * B = 2 tasks admitted")
    first, second = await admitted()
    await run_to_ready(rig, first)
    await until(lambda: assigned_to(rig, first.task_id, 0), "the first ready group assigned to step 0")

    await rig.publish(
        trainer_events.GroupSetAside(task_id=first.task_id, reason="out of memory", attempts=3), "trainer"
    )

    async def set_aside() -> bool:
        task = (await rig.stub.GetTask(pb.GetTaskRequest(task_id=first.task_id))).task
        return task.state == pb.TASK_STATE_SET_ASIDE

    await until(set_aside, "the task set aside")
    listed = await rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=first.task_id))
    assert [e.state for e in listed.executions] == [pb.EXECUTION_STATE_SET_ASIDE]

    await run_to_ready(rig, second)
    await until(
        lambda: assigned_to(rig, second.task_id, 0),
        "the second ready group assigned to step 0, in the set-aside group's place",
    )
