"""A sandbox that cannot be created, through the real runner: the execution is replaced and the
replacement runs in its own sandbox.

Real NATS and Postgres; the real scheduler, runner, evaluator and trajectory service. The harness
is the built-in agent against a scripted model (the harness's model boundary). The fault is at the
sandbox boundary: a file already stands where the runner creates one execution's sandbox, so that
sandbox cannot be created (the runner's SANDBOX failure), while a new execution's can.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import grpc
import pytest

from bench.scripted_model import ScriptedModel
from gyre.devstack.scratch import scratch_kernel
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build as build_evaluator
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory
from tests.trainer_stack import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent


async def test_a_sandbox_that_cannot_be_created_is_replaced_and_the_replacement_runs(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    model = ScriptedModel(script={"main": [{"final": "nothing to do"}]})
    url = model.start()
    async with scratch_kernel(*server_urls, label="retry-runner") as kernel:
        runner, supervisor = await build_with_supervisor(
            RunnerSettings(
                sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
                proxy_base_url=url,
            ),
            kernel,
        )
        hosts: list[ServiceHost] = [
            await build_scheduler(
                SchedulerSettings(port=0, admission="at_submit", runner_address=runner.address), kernel
            ),
            await build_evaluator(EvaluatorSettings(sandbox_root=tmp_path / "grading"), kernel),
            await build_trajectory(TrajectorySettings(port=0), kernel),
        ]
        for host in hosts:
            await host.start()
        channels = [grpc.aio.insecure_channel(h.address) for h in (hosts[0], hosts[2], runner)]
        scheduler = scheduler_pb2_grpc.SchedulerServiceStub(channels[0])
        trajectory = trajectory_pb2_grpc.TrajectoryServiceStub(channels[1])
        runs = runner_pb2_grpc.RunnerServiceStub(channels[2])
        obstacle: Path | None = None
        try:
            spec = pb.TaskSpec(
                name="csvsum", family="terminal", prompt="Sum the column.", group_size=2, timeout_s=60,
                harness="gyre-agent", workspace_template="task:csvsum", max_infra_retries=1,
            )  # fmt: skip
            answer = await scheduler.SubmitTasks(pb.SubmitTasksRequest(request_id="retry-1", tasks=[spec]))
            [task] = answer.tasks
            first, blocked = task.executions
            # Scheduled on the bus; the runner starts after the obstacle is in place.
            obstacle = supervisor.host.root / blocked.execution_id
            obstacle.write_text("in the way\n")
            await runner.start()

            async def replaced() -> str:
                listed = await scheduler.ListExecutions(pb.ListExecutionsRequest(task_id=task.task_id))
                return next(
                    (
                        e.replaced_by
                        for e in listed.executions
                        if e.execution.execution_id == blocked.execution_id
                    ),
                    "",
                )

            async def has_replacement() -> bool:
                return bool(await replaced())

            await eventually(has_replacement, timeout_s=60, what="a replacement scheduled")
            spare = await replaced()
            failed = (
                await runs.GetExecution(runner_pb2.GetExecutionRequest(execution_id=blocked.execution_id))
            ).execution
            assert failed.state == runner_pb2.EXECUTION_STATE_FAILED
            assert failed.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_SANDBOX

            async def ready() -> bool:
                group = (
                    await trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task.task_id))
                ).group
                return group.ready

            await eventually(ready, timeout_s=120, what="the group ready with its replacement")
            group = (await trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task.task_id))).group
            members = {e.execution_id: e for e in group.executions}
            assert list(members) == [first.execution_id, blocked.execution_id, spare]
            assert not members[blocked.execution_id].assessable
            assert members[spare].assessable and members[spare].has_reward and members[spare].replaces
            ran = (await runs.GetExecution(runner_pb2.GetExecutionRequest(execution_id=spare))).execution
            assert ran.state == runner_pb2.EXECUTION_STATE_FINISHED  # in a sandbox of its own
            listed = await scheduler.ListExecutions(pb.ListExecutionsRequest(task_id=task.task_id))
            states = {e.execution.execution_id: e.state for e in listed.executions}
            assert states[blocked.execution_id] == pb.EXECUTION_STATE_INFRA_FAILED
        finally:
            for channel in channels:
                await channel.close()
            await runner.stop()
            for host in reversed(hosts):
                await host.stop()
            if obstacle is not None:
                obstacle.unlink(missing_ok=True)
            if not os.environ.get("GYRE_KEEP_SANDBOXES"):
                supervisor.host.sweep()
                supervisor.host.root.rmdir()
            model.stop()
