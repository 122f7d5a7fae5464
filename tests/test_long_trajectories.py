"""A trajectory over the trainer's microbatch budget trains in a microbatch of its own; one over
what the trainer can hold sets its group aside with the reason, and the next group trains.

The budgets are tiny (`microbatch_max_tokens=8`, `trajectory_max_tokens=32`) so the test is fast;
the code path is a 53k-token Claude Code trajectory's on the 4,096-token default. Real NATS and
Postgres, the real scheduler, evaluator, trajectory service and trainer (`liveness_stack`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import test_infra_retry as infra
from liveness_stack import run_one, stack
from trainer_stack import events_on_bus, eventually

from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trainer.v1 import events_pb2 as trainer_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def s(
    server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[infra.Stack]:
    tmp = tmp_path_factory.mktemp("long")
    async with stack(server_urls, tmp, microbatch_max_tokens=8, trajectory_max_tokens=32) as started:
        yield started


async def test_a_trajectory_over_the_microbatch_budget_trains_in_a_microbatch_of_its_own(
    s: infra.Stack,
) -> None:
    task = await infra.submit(s, max_infra_retries=0)
    await infra.admitted(s, task.task_id, 2)
    short, long = task.executions
    await run_one(s, short)  # 6 tokens: within the budget
    await run_one(s, long, prompt_tokens=20)  # 23 tokens: over 8, within 32
    step = await infra.trained(s, task.task_id)
    assert step.num_samples == 2


async def test_a_trajectory_no_microbatch_can_hold_sets_its_group_aside_and_the_next_group_trains(
    s: infra.Stack,
) -> None:
    task = await infra.submit(s, max_infra_retries=0)
    await infra.admitted(s, task.task_id, 2)
    short, long = task.executions
    await run_one(s, short)
    await run_one(s, long, prompt_tokens=40)  # 43 tokens: past 32

    async def set_aside() -> bool:
        aside = await events_on_bus(s.rig.kernel, "trainer", trainer_events.GroupSetAside)
        return any(e.task_id == task.task_id for e in aside)

    await eventually(set_aside, timeout_s=60, what="the group set aside")
    aside = await events_on_bus(s.rig.kernel, "trainer", trainer_events.GroupSetAside)
    reason = next(e.reason for e in aside if e.task_id == task.task_id)
    assert "43 tokens" in reason and "32" in reason

    async def shown() -> bool:
        return {e.state for e in await s.executions(task.task_id)} == {pb.EXECUTION_STATE_SET_ASIDE}

    await eventually(shown, timeout_s=30, what="the scheduler to show the group set aside")

    fresh = await infra.submit(s, max_infra_retries=0)
    await infra.admitted(s, fresh.task_id, 2)
    for ref in fresh.executions:
        await run_one(s, ref)
    await infra.trained(s, fresh.task_id)
