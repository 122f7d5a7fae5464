"""A scheduler with its live driver on real NATS and Postgres, a proxy, a core cell and one
satellite that beat (their agents are not running: switches are not exercised): the rig of the
driver tests."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message
from proxy_support import write_tokenizer

from gyre.bus import Bus, BusConfig
from gyre.common.v1 import ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event
from gyre.proxy.v1 import proxy_pb2_grpc
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from services.proxy.config import ProxySettings
from services.proxy.main import build_proxy
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build


@dataclass
class Rig:
    stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub
    bus: Bus
    kernel: KernelSettings
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub

    async def publish(self, payload: message.Message, producer: str) -> None:
        await self.bus.publish(new_event(payload, producer=producer, correlation_id=str(uuid.uuid4())))

    async def states(self) -> list[tuple[str, str]]:
        listed = await self.stub.ListExecutions(pb.ListExecutionsRequest())
        return [(e.execution.task_id, pb.ExecutionState.Name(e.state)) for e in listed.executions]


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    for _ in range(150):  # 15 s at most
        if await check():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@asynccontextmanager
async def driver_rig(
    server_urls: tuple[str, str], tmp_path: Path, *, cell_lost_after_s: float = 1.5, **settings: Any
) -> AsyncIterator[Rig]:
    """`cell_lost_after_s`: longer where the test runs services in this process that hold its event
    loop while they start (the cells' heartbeats are sent from it). `settings`: more of the
    scheduler's settings."""
    async with scratch_kernel(*server_urls, label="driver") as kernel:
        proxy = await build_proxy(ProxySettings(model_dir=write_tokenizer(tmp_path / "tok")), kernel)
        await proxy.host.start()
        host = await build(
            SchedulerSettings(
                port=0,
                proxy_address=proxy.host.address,
                groups_per_step=1,
                max_staleness=1,
                tick_s=0.2,
                cell_lost_after_s=cell_lost_after_s,
                **settings,
            ),
            kernel,
        )
        await host.start()
        channel = grpc.aio.insecure_channel(host.address)
        assert kernel.nats_url is not None
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
        stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub = scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[assignment]
        await stub.RegisterCell(
            pb.RegisterCellRequest(
                request_id="core", cell_id="cell-0", core=True, agent_address="127.0.0.1:1"
            )
        )
        await stub.RegisterCell(
            pb.RegisterCellRequest(
                request_id="sat",
                cell_id="cell-1",
                slots=4,
                model_fingerprint="qwen2-tiny",
                engine_id="engine-1",
                engine_address="127.0.0.1:2",
                agent_address="127.0.0.1:3",
            )
        )
        proxy_stub = proxy_pb2_grpc.ProxyServiceStub(grpc.aio.insecure_channel(proxy.host.address))

        async def beat() -> None:  # cell-1 stays alive; cell-0's agent (the trainer) too
            while True:
                for cell_id in ("cell-0", "cell-1"):
                    await stub.SendHeartbeat(pb.SendHeartbeatRequest(cell_id=cell_id))
                await asyncio.sleep(0.2)

        beating = asyncio.ensure_future(beat())
        try:
            yield Rig(stub=stub, bus=bus, kernel=kernel, proxy=proxy_stub)
        finally:
            beating.cancel()
            await bus.close()
            await channel.close()
            await host.stop(grace_s=1)
            await proxy.host.stop(grace_s=1)


def spec(name: str) -> pb.TaskSpec:
    return pb.TaskSpec(
        name=name, family="terminal", prompt="2+2?", group_size=1, timeout_s=60, harness="gyre-agent"
    )


async def submit(rig: Rig, count: int) -> list[pb.Task]:
    answer = await rig.stub.SubmitTasks(
        pb.SubmitTasksRequest(
            request_id=f"sub-{uuid.uuid4().hex[:8]}", tasks=[spec(f"t{i}") for i in range(count)]
        )
    )
    return list(answer.tasks)


async def run_to_ready(rig: Rig, task: pb.Task) -> None:
    """What the runner, evaluator and trajectory service publish for a one-execution group, in order."""
    ref = task.executions[0]
    await rig.publish(runner_events.ExecutionStarted(execution=ref), "runner")
    await rig.publish(runner_events.ExecutionFinished(execution=ref, duration_s=3.0), "runner")
    grade = evaluator_pb2.Grade(
        execution_id=ref.execution_id, task_id=task.task_id, score=1.0, assessable=True
    )
    await rig.publish(evaluator_events.RewardAssigned(grade=grade), "evaluator")
    await rig.publish(
        trajectory_events.GroupReady(task_id=task.task_id, execution_ids=[ref.execution_id]), "trajectory"
    )


async def step_completed(rig: Rig, task_ids: list[str], *, version: int) -> None:
    """The trainer's StepCompleted for a step producing `version` from those tasks' groups."""
    await rig.publish(
        trainer_events.StepCompleted(
            version=ids_pb2.PolicyVersion(steps=version),
            task_ids=task_ids,
            num_target_tokens=40,
            duration_s=1.0,
        ),
        "trainer",
    )


async def run_to_trained(rig: Rig, task: pb.Task, *, version: int) -> None:
    await run_to_ready(rig, task)
    await step_completed(rig, [task.task_id], version=version)
