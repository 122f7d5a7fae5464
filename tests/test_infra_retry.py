"""Infrastructure failures are replaced in their group, and the group trains with the replacement.

Real NATS and Postgres; the real scheduler (paced admission by its live driver), evaluator,
trajectory service and trainer. The test stands in for the runner and the proxy at the harness
boundary: it publishes what they publish for an execution (started, the model call the proxy
recorded, the end event with the workspace). The injected failure is the runner's end with an
infrastructure cause (RUNNER_LOST: the sandbox's keeper died after the harness made a call), which
the real evaluator turns into a grade that is not assessable.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import nats
import pytest
from prometheus_client import REGISTRY
from scheduler_rig import Rig, driver_rig
from trainer_stack import events_on_bus, eventually, start_trainer

from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event, stream_name, subject_of
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.evaluator.config import EvaluatorSettings
from services.evaluator.main import build as build_evaluator
from services.evaluator.taskset import BUNDLED
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")
INFRA_FAILURES = "gyre_scheduler_infra_failures_total"


@dataclass
class Stack:
    rig: Rig
    trajectory: trajectory_pb2_grpc.TrajectoryServiceStub
    tmp: Path

    async def executions(self, task_id: str) -> list[pb.Execution]:
        listed = await self.rig.stub.ListExecutions(pb.ListExecutionsRequest(task_id=task_id))
        return list(listed.executions)

    async def group(self, task_id: str) -> trajectory_pb2.Group:
        return (await self.trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))).group


@asynccontextmanager
async def stack(server_urls: tuple[str, str], tmp_path: Path) -> AsyncIterator[Stack]:
    async with driver_rig(server_urls, tmp_path, cell_lost_after_s=120) as rig:
        hosts: list[ServiceHost] = [
            await build_trajectory(TrajectorySettings(port=0), rig.kernel),
            await build_evaluator(EvaluatorSettings(sandbox_root=tmp_path / "grading"), rig.kernel),
        ]
        for host in hosts:
            await host.start()
        trainer = await start_trainer(rig.kernel, hosts[0].address, tmp_path / "trainer")
        channel = grpc.aio.insecure_channel(hosts[0].address)
        try:
            yield Stack(rig=rig, trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channel), tmp=tmp_path)
        finally:
            await channel.close()
            await trainer.stop()
            for host in reversed(hosts):
                await host.stop()


async def submit(s: Stack, *, max_infra_retries: int) -> pb.Task:
    spec = pb.TaskSpec(
        name="csvsum",
        family="terminal",
        prompt="Write the sum of data.csv's column to total.txt",
        group_size=2,
        timeout_s=60,
        harness="gyre-agent",
        workspace_template="task:csvsum",
        max_infra_retries=max_infra_retries,
    )
    answer = await s.rig.stub.SubmitTasks(
        pb.SubmitTasksRequest(request_id=f"r-{uuid.uuid4().hex[:8]}", tasks=[spec])
    )
    [task] = answer.tasks
    return task


async def admitted(s: Stack, task_id: str, n: int) -> None:
    async def check() -> bool:
        states = [e.state for e in await s.executions(task_id)]
        return states.count(pb.EXECUTION_STATE_ADMITTED) == n

    await eventually(check, timeout_s=30, what=f"{n} executions admitted by the driver")


async def run(s: Stack, ref: ids_pb2.ExecutionRef, *, token: int, failure: bool = False) -> None:
    """What the runner and the proxy publish for one execution that makes one model call: it ends
    with its workspace (total.txt right when `token` is even), or lost by the runner (`failure`)."""
    work = s.tmp / f"ws-{ref.execution_id}"
    shutil.copytree(BUNDLED / "csvsum" / "workspace", work)
    if token % 2 == 0:
        (work / "total.txt").write_text("12\n")
    call = proxy_pb2.CallRecord(
        execution_id=ref.execution_id,
        call_id=str(uuid.uuid4()),
        agent_role=proxy_pb2.AGENT_ROLE_MAIN,
        agent_id="main",
        output_ids=[20 + token, 30 + token, 40 + token],
        output_logprobs=[-1.0, -1.5, -2.0],
        engine_id="cell-1",
    )
    call.full_prompt.prompt_ids.extend([1, 2, 3 + token])
    await s.rig.publish(runner_events.ExecutionStarted(execution=ref, harness="gyre-agent"), "runner")
    await s.rig.publish(proxy_events.LlmCallRecorded(call=call), "proxy")
    common = {"execution": ref, "workspace_uri": work.as_uri(), "family": "terminal", "task": "csvsum"}
    if failure:
        lost = runner_pb2.ExecutionFailure(
            kind=runner_pb2.EXECUTION_FAILURE_KIND_RUNNER_LOST,
            reason="the sandbox's keeper ended without an outcome",
        )
        await s.rig.publish(
            runner_events.ExecutionFailed(**common, failure=lost, num_calls_recorded=1), "runner"
        )
    else:
        await s.rig.publish(
            runner_events.ExecutionFinished(**common, duration_s=2.0, num_calls_recorded=1), "runner"
        )


async def reward_envelope(s: Stack, execution_id: str) -> envelope_pb2.Envelope:
    """The evaluator's RewardAssigned for one execution, as it went out on the bus."""
    assert s.rig.kernel.nats_url is not None
    nc = await nats.connect(s.rig.kernel.nats_url)
    try:
        js = nc.jetstream()
        name = stream_name("evaluator", prefix=s.rig.kernel.bus_prefix)
        info = await js.stream_info(name)
        for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):
            envelope = envelope_pb2.Envelope.FromString((await js.get_msg(name, seq)).data or b"")
            reward = evaluator_events.RewardAssigned()
            if envelope.payload.Unpack(reward) and reward.grade.execution_id == execution_id:
                return envelope
    finally:
        await nc.close()
    raise AssertionError(f"no RewardAssigned for {execution_id}")


async def trained(s: Stack, task_id: str) -> trainer_events.StepCompleted:
    async def check() -> bool:
        steps = await events_on_bus(s.rig.kernel, "trainer", trainer_events.StepCompleted)
        return any(task_id in step.task_ids for step in steps)

    await eventually(check, timeout_s=90, what=f"a step training {task_id}")
    steps = await events_on_bus(s.rig.kernel, "trainer", trainer_events.StepCompleted)
    return next(step for step in steps if task_id in step.task_ids)


def infra_failures(replaced: str) -> float:
    return REGISTRY.get_sample_value(INFRA_FAILURES, {"replaced": replaced}) or 0.0


async def one_lost(
    s: Stack, *, max_infra_retries: int
) -> tuple[pb.Task, ids_pb2.ExecutionRef, ids_pb2.ExecutionRef]:
    """A group of two, admitted by the driver: the first finishes, the runner loses the second."""
    task = await submit(s, max_infra_retries=max_infra_retries)
    await admitted(s, task.task_id, 2)
    first, lost = task.executions
    await run(s, first, token=0)
    await run(s, lost, token=1, failure=True)
    return task, first, lost


async def test_a_runner_lost_execution_is_replaced_and_the_group_trains_with_the_replacement(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with stack(server_urls, tmp_path) as s:
        replaced_before = infra_failures("true")
        task, first, lost = await one_lost(s, max_infra_retries=1)

        async def replacement_known() -> bool:
            return (await s.group(task.task_id)).num_replacements == 1

        await eventually(replacement_known, timeout_s=30, what="the replacement in the trajectory group")
        group = await s.group(task.task_id)
        assert not group.ready  # it waits for the replacement: nothing trained without it
        listed = {e.execution.execution_id: e for e in await s.executions(task.task_id)}
        failed = listed[lost.execution_id]
        assert failed.state == pb.EXECUTION_STATE_INFRA_FAILED
        assert "keeper ended without an outcome" in failed.failure_reason
        spare = listed[failed.replaced_by]
        assert (spare.replaces, spare.execution.index_in_group) == (lost.execution_id, 2)
        assert spare.state == pb.EXECUTION_STATE_ADMITTED  # scheduled through the runner's event
        scheduled = await events_on_bus(s.rig.kernel, "scheduler", scheduler_events.ExecutionScheduled)
        assert [e.execution.execution_id for e in scheduled].count(spare.execution.execution_id) == 1

        async def counted() -> bool:  # the relay counts it once the bus accepted the event
            return infra_failures("true") == replaced_before + 1

        await eventually(counted, timeout_s=30, what="the replaced failure counted")

        # The failure again: redelivered as it was (another message id, the same event id), and
        # re-sent under a new event id. Neither schedules a second replacement.
        original = await reward_envelope(s, lost.execution_id)
        await s.rig.bus.js.publish(
            subject_of(original, prefix=s.rig.bus.prefix),
            original.SerializeToString(),
            headers={"Nats-Msg-Id": f"again-{original.event_id}"},
        )
        resent = evaluator_events.RewardAssigned()
        original.payload.Unpack(resent)
        await s.rig.bus.publish(new_event(resent, producer="evaluator", correlation_id=task.task_id))

        # The replacement runs; its grade comes after the repeats on the evaluator's stream.
        await run(s, spare.execution, token=2)
        step = await trained(s, task.task_id)
        assert step.num_samples == 2  # the first and the replacement; the lost one's call is out

        listed = {e.execution.execution_id: e for e in await s.executions(task.task_id)}
        assert len(listed) == 3
        assert listed[lost.execution_id].state == pb.EXECUTION_STATE_INFRA_FAILED
        assert {listed[e].state for e in (first.execution_id, spare.execution.execution_id)} == {
            pb.EXECUTION_STATE_TRAINED
        }
        decided = await events_on_bus(s.rig.kernel, "scheduler", scheduler_events.ExecutionReplacementDecided)
        assert [d.execution.execution_id for d in decided] == [lost.execution_id]
        assert infra_failures("true") == replaced_before + 1
        group = await s.group(task.task_id)
        assert (group.ready, group.num_unassessable, group.num_replacements) == (True, 1, 1)

        samples = trajectory_pb2.StreamSamplesRequest(task_ids=[task.task_id])
        weights: dict[str, float] = {}
        async for answer in s.trajectory.StreamSamples(samples):
            sample = answer.sample
            weights[sample.execution_id] = weights.get(sample.execution_id, 0.0) + sum(sample.token_weight)
        # E counts the two contributing executions: each weighs 1/2 in all.
        assert weights == pytest.approx({first.execution_id: 0.5, spare.execution.execution_id: 0.5})


async def test_a_task_allowing_no_retries_trains_without_the_failed_execution(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with stack(server_urls, tmp_path) as s:
        not_replaced_before = infra_failures("false")
        task, _, lost = await one_lost(s, max_infra_retries=0)
        step = await trained(s, task.task_id)
        assert step.num_samples == 1
        listed = {e.execution.execution_id: e for e in await s.executions(task.task_id)}
        assert len(listed) == 2
        assert listed[lost.execution_id].state == pb.EXECUTION_STATE_INFRA_FAILED
        assert listed[lost.execution_id].replaced_by == ""
        [decided] = await events_on_bus(
            s.rig.kernel, "scheduler", scheduler_events.ExecutionReplacementDecided
        )
        assert not decided.HasField("replacement") and "allowance spent" in decided.reason
        assert infra_failures("false") == not_replaced_before + 1
