"""A runner registers what it can run with the scheduler, and SubmitTasks then refuses, as
INVALID_ARGUMENT naming the field, what could only fail later: a git URL outside the runner's
prefixes, a task set it does not have, a harness whose program it did not find, a harness_env
the harness does not take. A task's harness_env is stored with it. Real scheduler and runner
(in this process), real NATS and Postgres; no cell, so nothing is admitted or launched."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from gyre.devstack.scratch import scratch_kernel
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent
TASK = {"name": "t", "family": "terminal", "prompt": "Do it.", "group_size": 1, "timeout_s": 60}


@pytest_asyncio.fixture(loop_scope="session")
async def scheduler(
    server_urls: tuple[str, str], tmp_path: Path
) -> AsyncIterator[scheduler_pb2_grpc.SchedulerServiceAsyncStub]:
    """A scheduler a runner has registered with: task set `swe` (task `fix-1`), git prefix
    https://github.com/org/, no `claude` on its sandboxes' PATH."""
    (tmp_path / "swe" / "fix-1" / "workspace").mkdir(parents=True)
    async with scratch_kernel(*server_urls, label="refusals") as kernel:
        host = await build(SchedulerSettings(port=0), kernel)
        await host.start()
        runner, supervisor = await build_with_supervisor(
            RunnerSettings(
                sandbox_root=REPO / ".gyre" / "test-sandboxes" / f"refusals-{uuid.uuid4().hex[:8]}",
                scheduler_address=host.address,
                task_sets={"swe": tmp_path / "swe"},
                template_urls=["https://github.com/org/"],
                sandbox_runtime=[str(tmp_path / "no-harness-here")],
            ),
            kernel,
        )
        channel = grpc.aio.insecure_channel(host.address)
        try:
            await runner.start()
            yield scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[misc]
        finally:
            await channel.close()
            await runner.stop(grace_s=1)
            supervisor.host.root.rmdir()
            await host.stop(grace_s=1)


async def submit(stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub, **spec: object) -> pb.Task:
    request = pb.SubmitTasksRequest(
        request_id=f"r-{uuid.uuid4().hex[:8]}", tasks=[pb.TaskSpec(**TASK, **spec)]
    )  # type: ignore[arg-type]
    return (await stub.SubmitTasks(request)).tasks[0]


async def refusal(stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub, **spec: object) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await submit(stub, **spec)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    return str(err.value.details())


async def registered(stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub) -> None:
    """Until the runner's registration arrived (it registers as it starts)."""
    for _ in range(100):  # bounded: 10 s
        try:
            await submit(stub, harness="claude-code")
        except grpc.aio.AioRpcError:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the runner never registered")


async def test_what_the_registered_runner_cannot_run_is_refused_by_field(
    scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    await registered(scheduler)
    says = await refusal(scheduler, harness="claude-code")
    assert says.startswith("tasks[0].harness: no registered runner can start 'claude-code'")
    says = await refusal(scheduler, harness="gyre-agent", workspace_template="https://gitlab.example/x/r.git")
    assert says.startswith("tasks[0].workspace_template: 'https://gitlab.example/x/r.git' is under none")
    says = await refusal(scheduler, harness="gyre-agent", workspace_template="taskset:other/fix-1")
    assert says.startswith("tasks[0].workspace_template: no runner has the task set 'other'")
    says = await refusal(scheduler, harness="gyre-agent", harness_env={"GYRE_AGENT_MAX_TURNS": "lots"})
    assert says.startswith("tasks[0].harness_env['GYRE_AGENT_MAX_TURNS']: gyre-agent takes values")


async def test_a_runnable_task_keeps_its_harness_env(
    scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    await registered(scheduler)
    task = await submit(
        scheduler,
        harness="gyre-agent",
        workspace_template="taskset:swe/fix-1",
        harness_env={"GYRE_AGENT_MAX_TURNS": "3"},
    )
    stored = (await scheduler.GetTask(pb.GetTaskRequest(task_id=task.task_id))).task
    assert dict(stored.spec.harness_env) == {"GYRE_AGENT_MAX_TURNS": "3"}
