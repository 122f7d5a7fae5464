"""A group the trainer fails on again and again is set aside with the reason, not retried forever."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_trainer_service import trainer_and_trajectory
from trainer_stack import events_on_bus, eventually, submit_group

from gyre.trainer.v1 import events_pb2

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_group_no_step_can_train_is_set_aside_and_the_next_one_trains(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with trainer_and_trajectory(server_urls, tmp_path, max_group_attempts=2) as (
        kernel,
        trajectory,
        _,
        bus,
    ):
        poison = await submit_group(
            bus, trajectory.address, index=0, token_offset=1_000_000
        )  # past the vocab
        good = await submit_group(bus, trajectory.address, index=1)

        async def stepped() -> bool:
            return bool(await events_on_bus(kernel, "trainer", events_pb2.StepCompleted))

        async def set_aside() -> bool:
            return bool(await events_on_bus(kernel, "trainer", events_pb2.GroupSetAside))

        # Either group may be ready first: the good one trains before or after the poison one's
        # attempts run out, so wait for both outcomes rather than for the first step.
        await eventually(set_aside, timeout_s=60, what="the poison group set aside")
        await eventually(stepped, timeout_s=60, what="a step with the good group")
        (aside,) = await events_on_bus(kernel, "trainer", events_pb2.GroupSetAside)
        steps = await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)
    assert (aside.task_id, aside.attempts) == (poison, 2)
    assert "index" in aside.reason.lower(), aside.reason  # the step's own error, for whoever looks
    assert [list(s.task_ids) for s in steps] == [[good]]
