"""`gyre cancel` of one execution ends its group: the group trains without it, and later steps go on.

Real NATS and Postgres; the real scheduler (its live driver admits and assigns), evaluator,
trajectory service and trainer (`liveness_stack`). The test stands in for the runner and the
proxy at the harness boundary: one member finishes, the other is cancelled after one model call,
as the runner's `CancelExecution` ends it (`ExecutionCancelled`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_infra_retry as infra
from liveness_stack import run_one, stack
from trainer_stack import events_on_bus

from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_cancelled_execution_leaves_its_group_training_without_it_and_later_steps_proceed(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with stack(server_urls, tmp_path) as s:
        # An allowance of retries: the trajectory service waits for the scheduler's decision
        # about the cancelled member (with none it would not wait).
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
        [decided] = await events_on_bus(
            s.rig.kernel, "scheduler", scheduler_events.ExecutionReplacementDecided
        )
        assert decided.cancelled and not decided.HasField("replacement")
        assert "cancelled" in decided.reason

        # The next step is not held back: a fresh task is admitted and trains.
        fresh = await infra.submit(s, max_infra_retries=1)
        await infra.admitted(s, fresh.task_id, 2)
        for ref in fresh.executions:
            await run_one(s, ref)
        await infra.trained(s, fresh.task_id)
