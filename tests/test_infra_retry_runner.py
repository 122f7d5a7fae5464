"""Infrastructure failures through the real runner: the execution is replaced and the replacement
runs in its own sandbox.

Real NATS and Postgres; the real scheduler, runner, evaluator and trajectory service. The harness
is the built-in agent. Two faults:
- at the sandbox boundary (the agent against a scripted model): a file already stands where the
  runner creates one execution's sandbox, so that sandbox cannot be created (the runner's SANDBOX
  failure), while a new execution's can;
- at the model endpoint (the agent against the real proxy, which has no engine): every model call
  is answered 503, the agent gives up and exits non-zero, and the runner ends it MODEL_UNAVAILABLE
  rather than as a crash of the policy's.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from proxy_support import write_tokenizer

from bench.scripted_model import ScriptedModel
from gyre.devstack.scratch import scratch_kernel
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build as build_evaluator
from services.proxy.config import ProxySettings
from services.proxy.main import build_proxy
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor
from services.runner.supervisor import Supervisor
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory
from tests.grpc_wait import once_found
from tests.trainer_stack import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent


@dataclass(slots=True, kw_only=True)
class Stack:
    runner: ServiceHost
    """Not started: a test starts it once its fault is in place."""
    supervisor: Supervisor
    scheduler: Any
    trajectory: Any
    runs: Any
    trajectory_address: str = ""

    async def replaced_by(self, task_id: str, execution_id: str) -> str:
        """The execution that replaced `execution_id`, or "" while none does."""
        listed = await self.scheduler.ListExecutions(pb.ListExecutionsRequest(task_id=task_id))
        return next(
            (e.replaced_by for e in listed.executions if e.execution.execution_id == execution_id), ""
        )

    async def group(self, task_id: str) -> trajectory_pb2.Group:
        request = trajectory_pb2.GetGroupRequest(task_id=task_id)
        found = await once_found(lambda: self.trajectory.GetGroup(request), what=f"task {task_id}'s group")
        return found.group

    async def ran(self, execution_id: str) -> runner_pb2.Execution:
        get = runner_pb2.GetExecutionRequest(execution_id=execution_id)
        return (await self.runs.GetExecution(get)).execution

    async def scheduler_states(self, task_id: str) -> dict[str, int]:
        listed = await self.scheduler.ListExecutions(pb.ListExecutionsRequest(task_id=task_id))
        return {e.execution.execution_id: e.state for e in listed.executions}


@asynccontextmanager
async def retry_stack(kernel: KernelSettings, tmp_path: Path, runner: RunnerSettings) -> AsyncIterator[Stack]:
    """Scheduler, evaluator and trajectory service started; the runner built on `runner`."""
    runner_host, supervisor = await build_with_supervisor(runner, kernel)
    hosts: list[ServiceHost] = [
        await build_scheduler(
            SchedulerSettings(port=0, admission="at_submit", runner_address=runner_host.address), kernel
        ),
        await build_evaluator(EvaluatorSettings(sandbox_root=tmp_path / "grading"), kernel),
        await build_trajectory(TrajectorySettings(port=0), kernel),
    ]
    for host in hosts:
        await host.start()
    channels = [grpc.aio.insecure_channel(h.address) for h in (hosts[0], hosts[2], runner_host)]
    try:
        yield Stack(
            runner=runner_host,
            supervisor=supervisor,
            scheduler=scheduler_pb2_grpc.SchedulerServiceStub(channels[0]),
            trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channels[1]),
            runs=runner_pb2_grpc.RunnerServiceStub(channels[2]),
            trajectory_address=hosts[2].address,
        )
    finally:
        for channel in channels:
            await channel.close()
        await runner_host.stop()
        for host in reversed(hosts):
            await host.stop()
        if not os.environ.get("GYRE_KEEP_SANDBOXES"):
            supervisor.host.sweep()
            supervisor.host.root.rmdir()


def sandbox_root() -> Path:
    return REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8]


async def submit(stack: Stack, *, request_id: str, group_size: int) -> pb.Task:
    spec = pb.TaskSpec(
        name="csvsum", family="terminal", prompt="Sum the column.", group_size=group_size, timeout_s=60,
        harness="gyre-agent", workspace_template="task:csvsum", max_infra_retries=1,
    )  # fmt: skip
    answer = await stack.scheduler.SubmitTasks(pb.SubmitTasksRequest(request_id=request_id, tasks=[spec]))
    [task] = answer.tasks
    return task


async def test_a_sandbox_that_cannot_be_created_is_replaced_and_the_replacement_runs(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    model = ScriptedModel(script={"main": [{"final": "nothing to do"}]})
    url = model.start()
    obstacle: Path | None = None
    try:
        async with (
            scratch_kernel(*server_urls, label="retry-runner") as kernel,
            retry_stack(
                kernel, tmp_path, RunnerSettings(sandbox_root=sandbox_root(), proxy_base_url=url)
            ) as stack,
        ):
            try:
                task = await submit(stack, request_id="retry-1", group_size=2)
                first, blocked = task.executions
                # Scheduled on the bus; the runner starts after the obstacle is in place.
                obstacle = stack.supervisor.host.root / blocked.execution_id
                obstacle.write_text("in the way\n")
                await stack.runner.start()

                async def has_replacement() -> bool:
                    return bool(await stack.replaced_by(task.task_id, blocked.execution_id))

                await eventually(has_replacement, timeout_s=60, what="a replacement scheduled")
                spare = await stack.replaced_by(task.task_id, blocked.execution_id)
                failed = await stack.ran(blocked.execution_id)
                assert failed.state == runner_pb2.EXECUTION_STATE_FAILED
                assert failed.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_SANDBOX

                async def ready() -> bool:
                    return (await stack.group(task.task_id)).ready

                await eventually(ready, timeout_s=120, what="the group ready with its replacement")
                group = await stack.group(task.task_id)
                members = {e.execution_id: e for e in group.executions}
                assert list(members) == [first.execution_id, blocked.execution_id, spare]
                assert not members[blocked.execution_id].assessable
                assert members[spare].assessable and members[spare].has_reward and members[spare].replaces
                ran = await stack.ran(spare)
                assert ran.state == runner_pb2.EXECUTION_STATE_FINISHED  # in a sandbox of its own
                states = await stack.scheduler_states(task.task_id)
                assert states[blocked.execution_id] == pb.EXECUTION_STATE_INFRA_FAILED
            finally:
                if obstacle is not None:
                    obstacle.unlink(missing_ok=True)
    finally:
        model.stop()


async def test_an_agent_the_proxy_failed_ends_model_unavailable_ungraded_and_is_replaced(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    """No engine serves: the proxy answers the agent's call 503, the agent gives up (exit 3, at
    once with GYRE_AGENT_RETRY_S=0). Not the policy's crash: not graded, replaced; the replacement
    meets the same outage, and with the allowance spent the group is ready with nothing to train."""
    async with scratch_kernel(*server_urls, label="model-unavailable") as kernel:
        proxy = await build_proxy(ProxySettings(model_dir=write_tokenizer(tmp_path / "tokenizer")), kernel)
        await proxy.host.start()
        settings = RunnerSettings(
            sandbox_root=sandbox_root(),
            proxy_address=proxy.host.address,
            proxy_base_url=proxy.http_url,
            harness_env={"GYRE_AGENT_RETRY_S": "0"},
        )
        try:
            async with retry_stack(kernel, tmp_path, settings) as stack:
                await stack.runner.start()
                task = await submit(stack, request_id="unavailable-1", group_size=1)
                [first] = task.executions

                async def ready() -> bool:
                    return (await stack.group(task.task_id)).ready

                await eventually(
                    ready, timeout_s=120, what="the group ready after its replacement failed too"
                )
                spare = await stack.replaced_by(task.task_id, first.execution_id)
                assert spare, "the execution the proxy failed was replaced"
                for execution_id in (first.execution_id, spare):
                    ended = await stack.ran(execution_id)
                    assert ended.state == runner_pb2.EXECUTION_STATE_FAILED
                    assert ended.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_MODEL_UNAVAILABLE
                    assert "the proxy failed 1 of the harness's model calls" in ended.failure.reason
                    assert "no engine is serving" in ended.failure.reason
                    assert ended.exit_code == 3  # the agent's "model endpoint failed"
                group = await stack.group(task.task_id)
                assert [e.execution_id for e in group.executions] == [first.execution_id, spare]
                assert not any(e.assessable for e in group.executions)
                states = await stack.scheduler_states(task.task_id)
                assert states == {
                    first.execution_id: pb.EXECUTION_STATE_INFRA_FAILED,
                    spare: pb.EXECUTION_STATE_INFRA_FAILED,
                }
        finally:
            await proxy.host.stop()


FORGE = (
    'python -c "import ctypes,os\nlibc=ctypes.CDLL(None)\n'
    "for p in [int(d) for d in os.listdir('/proc') if d.isdigit()]:\n"
    "  f=libc.syscall(438,libc.syscall(434,p,0),2,0)\n"
    "  f>=0 and os.write(f,b'gyre-sandbox: setup failed: [Errno 2] No such file\\\\n')\"; "
    "echo 'gyre-sandbox: setup failed: [Errno 2] No such file' >&2; kill -SEGV $PPID"
)
"""The agent's shell tells the host, through every stderr it can reach, that set-up failed, then
kills the agent (issue 27): `test_forgery_trained_live` trains on such a member's 0."""
