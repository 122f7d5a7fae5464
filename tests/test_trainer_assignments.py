"""With steps from the scheduler, the trainer trains exactly the groups `StepAssigned` names for
each step, in that order, not the groups in their arrival order (real NATS, Postgres, trajectory)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trainer_service import trainer_and_trajectory
from trainer_stack import events_on_bus, eventually, submit_group

from gyre.events import new_event
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.trainer.v1 import events_pb2

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]


async def test_each_step_takes_the_groups_the_scheduler_assigned_to_it(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with trainer_and_trajectory(server_urls, tmp_path, steps_from_scheduler=True) as (
        kernel,
        trajectory,
        _trainer,
        bus,
    ):

        async def steps() -> list[events_pb2.StepCompleted]:
            return await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)

        async def assign(step: int, task_id: str) -> None:
            event = scheduler_events.StepAssigned(step=step, task_ids=[task_id])
            await bus.publish(new_event(event, producer="scheduler", correlation_id=f"step-{step}"))

        first = await submit_group(bus, trajectory.address, index=0)
        second = await submit_group(bus, trajectory.address, index=1)
        await assign(0, second)  # the later arrival is due first
        await eventually(lambda: _count(steps, 1), timeout_s=30, what="step 1")
        await assign(1, first)
        await eventually(lambda: _count(steps, 2), timeout_s=30, what="step 2")
        assert [(s.version.steps, list(s.task_ids)) for s in await steps()] == [(1, [second]), (2, [first])]


async def _count(steps: object, n: int) -> bool:
    return len(await steps()) >= n  # type: ignore[operator]
