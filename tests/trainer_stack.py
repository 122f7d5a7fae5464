"""Helpers for trainer tests on real NATS and Postgres: a fresh database and bus prefix, ready groups.

Each trainer test gets a kernel of its own (database and bus prefix), because a trainer's durable
`GroupReady` consumer and its tables must not be shared with another trainer of the same session.
Groups are made the way production makes them: `TaskSubmitted`, `LlmCallRecorded` and
`RewardAssigned` events go to the real trajectory service, which publishes `GroupReady`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, TypeVar

import grpc
import nats
from google.protobuf import message

from gyre.bus import Bus, BusConfig
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event, stream_name
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc

M = TypeVar("M", bound=message.Message)


def fresh_kernel(nats_url: str, admin_database_url: str) -> AbstractAsyncContextManager[KernelSettings]:
    """Its own database and bus prefix on the session's servers, removed afterwards."""
    return scratch_kernel(nats_url, admin_database_url, label="trainer")


async def connect_bus(kernel: KernelSettings) -> Bus:
    assert kernel.nats_url is not None
    return await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))


async def submit_group(
    bus: Bus,
    trajectory_address: str,
    *,
    index: int,
    num_calling: int = 2,
    task: scheduler_pb2.Task | None = None,
    policy_version: int = 0,
    token_offset: int = 0,
    scores: tuple[float, float] = (1.0, 0.0),
    checks: tuple[tuple[evaluator_pb2.CheckResult, ...], ...] = ((), ()),
) -> str:
    """A ready group of two executions (rewards `scores`, graded with `checks`), one model call each;
    returns its task id.

    Only the first `num_calling` executions record their call (the others failed before calling).
    With `task` (a group of two the real scheduler accepted, which published `TaskSubmitted`),
    its ids are used; otherwise the task is made up here. Calls carry `policy_version`.

    Each reward carries the number of calls the proxy recorded, as the evaluator passes it on
    from the runner's end event, so the rewards may go out before the calls: the trajectory
    service marks the group ready only once they are stored. Returns once that service knows
    the group.

    Token ids stay below 100 (the tiny model's vocabulary) unless `token_offset` moves the
    outputs past it (a group no step can train); `index` varies the prompt.
    """
    scheduled = task is not None
    if task is None:
        made_up = str(uuid.uuid4())
        task = scheduler_pb2.Task(
            task_id=made_up,
            spec=scheduler_pb2.TaskSpec(family="arith", group_size=2),
            executions=[
                ids_pb2.ExecutionRef(task_id=made_up, execution_id=str(uuid.uuid4()), index_in_group=i)
                for i in range(2)
            ],
        )
    task_id = task.task_id
    executions = [e.execution_id for e in task.executions]
    assert len(executions) == 2, "a group of two"

    async def publish(payload: message.Message, producer: str) -> None:
        await bus.publish(new_event(payload, producer=producer, correlation_id=task_id))

    if not scheduled:
        await publish(scheduler_events.TaskSubmitted(task=task), "scheduler")
    for k, execution_id in enumerate(executions):
        grade = evaluator_pb2.Grade(
            execution_id=execution_id, task_id=task_id, score=scores[k], assessable=True, checks=checks[k]
        )
        num_calls = 1 if k < num_calling else 0
        await publish(evaluator_events.RewardAssigned(grade=grade, num_calls_recorded=num_calls), "evaluator")
    for k, execution_id in enumerate(executions[:num_calling]):
        call = proxy_pb2.CallRecord(
            execution_id=execution_id,
            call_id=str(uuid.uuid4()),
            agent_role=proxy_pb2.AGENT_ROLE_MAIN,
            agent_id="main",
            output_ids=[token_offset + 20 + k, token_offset + 30 + k, token_offset + 40 + k],
            output_logprobs=[-1.0, -1.5, -2.0],
            engine_id="cell-1",
            policy_version=ids_pb2.PolicyVersion(steps=policy_version),
        )
        call.full_prompt.prompt_ids.extend([1, 2, 3 + index % 50])
        await publish(proxy_events.LlmCallRecorded(call=call), "proxy")
    async with grpc.aio.insecure_channel(trajectory_address) as channel:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)

        async def known() -> bool:
            try:
                await stub.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
                return False
            return True

        await eventually(known, timeout_s=30, what=f"group {task_id} in the trajectory service")
    return task_id


async def events_on_bus(kernel: KernelSettings, service: str, event_cls: type[M]) -> list[M]:
    """Every event of one type its producer published so far, in stream order."""
    assert kernel.nats_url is not None
    nc = await nats.connect(kernel.nats_url)
    try:
        js = nc.jetstream()
        name = event_cls.DESCRIPTOR.name
        try:
            sub = await js.pull_subscribe(
                f"{kernel.bus_prefix}.{service}.v1.{name}",
                stream=stream_name(service, prefix=kernel.bus_prefix),
            )
        except nats.js.errors.NotFoundError:  # its stream is made by its first publish: none yet
            return []
        out: list[M] = []
        for _ in range(20):  # bounded: 20 batches of 100
            try:
                msgs = await sub.fetch(100, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            for m in msgs:
                event = event_cls()
                envelope_pb2.Envelope.FromString(m.data).payload.Unpack(event)
                out.append(event)
        return out
    finally:
        await nc.close()


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s} s")
        await asyncio.sleep(0.2)


async def start_trainer(
    kernel: KernelSettings, trajectory_address: str, state_dir: Path, **settings: Any
) -> ServiceHost:
    """A started trainer taking one group per step, with a staleness bound no test reaches."""
    from services.trainer.config import TrainerSettings
    from services.trainer.main import build as build_trainer

    defaults: dict[str, Any] = {"groups_per_step": 1, "max_staleness_steps": 100}
    trainer = await build_trainer(
        TrainerSettings(
            port=0, state_dir=state_dir, trajectory_address=trajectory_address, **{**defaults, **settings}
        ),
        kernel,
    )
    await trainer.start()
    return trainer
