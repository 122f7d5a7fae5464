"""The lost-execution watchdog on the real stack: an execution whose runner goes silent after its
start (runner and keeper both gone: no end event ever comes) is ended by the scheduler past its
limit plus the grace, as an infrastructure failure with the reason, and its group trains without
it instead of waiting forever.

Real NATS and Postgres; the real scheduler (driver and watchdog), evaluator, trajectory service and
trainer (`liveness_stack`). The test plays the runner and the proxy: it publishes one member's
start and end, and only the start of the other. The scheduler has no runner address here, so the
cancel it asks first reaches nobody, as with a runner that is gone.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import test_infra_retry as infra
from liveness_stack import run_one, stack
from trainer_stack import events_on_bus

from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def s(
    server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[infra.Stack]:
    tmp = tmp_path_factory.mktemp("lost")
    async with stack(server_urls, tmp, scheduler_settings={"lost_grace_s": 1.0}) as started:
        yield started


async def test_an_execution_whose_runner_goes_silent_is_ended_and_its_group_trains_without_it(
    s: infra.Stack,
) -> None:
    spec = pb.TaskSpec(
        name="csvsum",
        family="terminal",
        prompt="Write the sum of data.csv's column to total.txt",
        group_size=2,
        timeout_s=1,
        harness="gyre-agent",
        workspace_template="task:csvsum",
        max_infra_retries=0,
    )
    answer = await s.rig.stub.SubmitTasks(
        pb.SubmitTasksRequest(request_id=f"r-{uuid.uuid4().hex[:8]}", tasks=[spec])
    )
    [task] = answer.tasks
    await infra.admitted(s, task.task_id, 2)
    kept, silent = task.executions
    await run_one(s, kept)
    await s.rig.publish(runner_events.ExecutionStarted(execution=silent, harness="gyre-agent"), "runner")

    step = await infra.trained(s, task.task_id)
    assert step.num_samples == 1  # the lost member is out of the loss
    listed = {e.execution.execution_id: e for e in await s.executions(task.task_id)}
    assert listed[silent.execution_id].state == pb.EXECUTION_STATE_INFRA_FAILED
    assert "no end from the runner" in listed[silent.execution_id].failure_reason
    assert "past its limit" in listed[silent.execution_id].failure_reason
    assert listed[kept.execution_id].state == pb.EXECUTION_STATE_TRAINED
    decided = await events_on_bus(s.rig.kernel, "scheduler", scheduler_events.ExecutionReplacementDecided)
    [about] = [d for d in decided if d.execution.execution_id == silent.execution_id]
    assert about.lost and not about.cancelled and not about.HasField("replacement")
