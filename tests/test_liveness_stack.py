"""Every wait has an end, on the real stack: `gyre cancel` of one execution or of a task in any
state, and a trajectory over the trainer's microbatch budget, never stop training; after each, a
fresh group trains.

Real NATS and Postgres; the real scheduler (its live driver admits and assigns), evaluator,
trajectory service and trainer taking the scheduler's steps (`liveness_stack`). The test stands in
for the runner and the proxy at the harness boundary: what they publish when executions finish,
or when the runner's `CancelExecution` ends one (`ExecutionCancelled`). The trainer's budgets are
tiny (`microbatch_max_tokens=8`, `trajectory_max_tokens=32`) so the test is fast; the code path
is a 53k-token Claude Code trajectory's on the 4,096-token default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import test_infra_retry as infra
from liveness_stack import publish_call, run_one, stack
from trainer_stack import events_on_bus, eventually

from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trainer.v1 import events_pb2 as trainer_events

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def s(
    server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[infra.Stack]:
    tmp = tmp_path_factory.mktemp("liveness")
    async with stack(server_urls, tmp, microbatch_max_tokens=8, trajectory_max_tokens=32) as started:
        yield started


async def a_fresh_task_trains(s: infra.Stack) -> pb.Task:
    fresh = await infra.submit(s, max_infra_retries=1)
    await infra.admitted(s, fresh.task_id, 2)
    for ref in fresh.executions:
        await run_one(s, ref)
    await infra.trained(s, fresh.task_id)
    return fresh


async def test_a_cancelled_execution_leaves_its_group_training_without_it_and_later_steps_proceed(
    s: infra.Stack,
) -> None:
    # An allowance of retries: the trajectory service waits for the scheduler's decision about
    # the cancelled member (with none it would not wait).
    task = await infra.submit(s, max_infra_retries=1)
    await infra.admitted(s, task.task_id, 2)
    kept, cancelled = task.executions
    await run_one(s, kept)
    await run_one(s, cancelled, cancel_reason="stuck in a loop")

    step = await infra.trained(s, task.task_id)
    assert step.num_samples == 1  # the cancelled member's call is out of the loss
    listed = {e.execution.execution_id: e for e in await s.executions(task.task_id)}
    assert len(listed) == 2  # not replaced: the cancel was an operator's decision
    assert listed[cancelled.execution_id].state == pb.EXECUTION_STATE_CANCELLED
    assert "stuck in a loop" in listed[cancelled.execution_id].failure_reason
    assert listed[kept.execution_id].state == pb.EXECUTION_STATE_TRAINED
    decided = await events_on_bus(s.rig.kernel, "scheduler", scheduler_events.ExecutionReplacementDecided)
    [about] = [d for d in decided if d.execution.execution_id == cancelled.execution_id]
    assert about.cancelled and not about.HasField("replacement")
    assert "cancelled" in about.reason

    await a_fresh_task_trains(s)  # the next step is not held back


async def test_a_task_is_cancelled_in_any_state_and_a_group_that_ended_its_rollout_never_trains(
    s: infra.Stack,
) -> None:
    task = await infra.submit(s, max_infra_retries=1)
    await infra.admitted(s, task.task_id, 2)
    first, second = task.executions
    await run_one(s, first)
    waiting = await run_one(s, second, calls_recorded=2)  # its group waits for a second call

    async def done() -> bool:
        got = await s.rig.stub.GetTask(pb.GetTaskRequest(task_id=task.task_id))
        return got.task.state == pb.TASK_STATE_DONE

    await eventually(done, timeout_s=30, what="the task done (every execution ended)")
    answer = await s.rig.stub.CancelTask(
        pb.CancelTaskRequest(request_id="cancel-done", task_id=task.task_id, reason="bad task")
    )
    assert answer.previous_state == pb.TASK_STATE_DONE
    await publish_call(s, waiting)  # the group becomes ready now: it must not train

    fresh = await a_fresh_task_trains(s)
    steps = await events_on_bus(s.rig.kernel, "trainer", trainer_events.StepCompleted)
    assert not any(task.task_id in step.task_ids for step in steps)
    got = await s.rig.stub.GetTask(pb.GetTaskRequest(task_id=task.task_id))
    assert got.task.state == pb.TASK_STATE_CANCELLED

    # A trained task has nothing left to cancel: answered as it is, not refused, not changed.
    again = await s.rig.stub.CancelTask(
        pb.CancelTaskRequest(request_id="cancel-trained", task_id=fresh.task_id)
    )
    assert again.previous_state == pb.TASK_STATE_TRAINED
    got = await s.rig.stub.GetTask(pb.GetTaskRequest(task_id=fresh.task_id))
    assert got.task.state == pb.TASK_STATE_TRAINED


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
