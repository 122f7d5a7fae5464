"""`gyre demo` (`make demo`): the vertical slice end to end on the local stack, narrated (shell).

Starts the stack (embedded NATS and PostgreSQL unless GYRE_NATS_URL / GYRE_DATABASE_URL are
set), submits a task group over gRPC, shows the `TaskSubmitted` event on JetStream and the
group as the trajectory service learned it, shows that a repeated request is answered from the
first, that bad input is refused naming the field, and stops what it started.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import grpc
import nats

from gyre.common.v1 import envelope_pb2
from gyre.devstack.stack import StackState, down, up
from gyre.events import stream_name
from gyre.scheduler.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc


def say(text: str) -> None:
    print(text, flush=True)


async def read_event(state: StackState, prefix: str, task_id: str) -> envelope_pb2.Envelope:
    """The TaskSubmitted of `task_id`, read back from the scheduler's stream (the relay may lag a bit)."""
    nc = await nats.connect(state.nats_url)
    js = nc.jetstream()
    stream = stream_name("scheduler", prefix=prefix)
    try:
        for _ in range(100):  # bounded: 10 s
            info = await js.stream_info(stream)
            for seq in range(info.state.last_seq, max(0, info.state.first_seq - 1), -1):  # newest first
                env = envelope_pb2.Envelope.FromString((await js.get_msg(stream, seq)).data or b"")
                payload = events_pb2.TaskSubmitted()
                env.payload.Unpack(payload)
                if payload.task.task_id == task_id:
                    return env
            await asyncio.sleep(0.1)
    finally:
        await nc.close()
    raise RuntimeError(f"no TaskSubmitted for {task_id} on stream {stream} within 10 s")


async def run_slice(state: StackState, prefix: str) -> None:
    async with (
        grpc.aio.insecure_channel(state.address_of("scheduler")) as sch,
        grpc.aio.insecure_channel(state.address_of("trajectory")) as trj,
    ):
        scheduler = scheduler_pb2_grpc.SchedulerServiceStub(sch)
        trajectory = trajectory_pb2_grpc.TrajectoryServiceStub(trj)
        request = scheduler_pb2.SubmitTasksRequest(
            request_id=f"demo-{uuid.uuid4().hex[:8]}",
            tasks=[
                scheduler_pb2.TaskSpec(
                    name="fizzbuzz package",
                    family="repo_generation",
                    prompt="Write a fizzbuzz package with tests.",
                    group_size=4,
                    timeout_s=3600,
                    harness="gyre-agent",
                    labels={"split": "demo"},
                )
            ],
        )
        say(f"\n1. SubmitTasks(request_id={request.request_id}, 1 task, group_size=4) -> scheduler")
        task = (await scheduler.SubmitTasks(request)).tasks[0]
        say(f"   task {task.task_id} accepted with executions:")
        for e in task.executions:
            say(f"     #{e.index_in_group} {e.execution_id}")

        env = await read_event(state, prefix, task.task_id)
        say(
            f"\n2. on JetStream: {env.event_type} event_id={env.event_id} correlation_id={env.correlation_id}"
        )

        started = time.monotonic()
        for _ in range(100):  # bounded: 10 s
            try:
                group = (
                    await trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task.task_id))
                ).group
                break
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError("the trajectory service did not register the group within 10 s")
        waited_ms = (time.monotonic() - started) * 1000
        say(
            f"\n3. trajectory.GetGroup -> group of {group.group_size} ({group.family}), ready={group.ready}, "
            f"seen {waited_ms:.0f} ms after the answer"
        )

        again = (await scheduler.SubmitTasks(request)).tasks[0]
        say(f"\n4. same request_id again -> same task {again.task_id} (no second batch): {again == task}")

        bad = scheduler_pb2.SubmitTasksRequest(
            request_id="demo-bad", tasks=[scheduler_pb2.TaskSpec(name="x")]
        )
        try:
            await scheduler.SubmitTasks(bad)
        except grpc.aio.AioRpcError as err:
            say(f"\n5. a task without a family -> {err.code().name}: {err.details()}")


def main(kernel: KernelSettings, *, keep: bool = False) -> int:
    where = (
        "embedded servers" if kernel.nats_url is None or kernel.database_url is None else "configured servers"
    )
    say(f"Starting the local stack on {where} (state in {kernel.state_dir}/) ...")
    started = time.monotonic()
    state = up(kernel)
    say(f"  NATS {state.nats_url}\n  Postgres {state.database_url}")
    for s in state.services:
        say(f"  {s.name:<10} pid {s.pid:<7} grpc {s.address}  log {s.log_path}")
    say(f"  up in {time.monotonic() - started:.1f} s")
    try:
        asyncio.run(run_slice(state, kernel.bus_prefix))
    finally:
        if keep:
            say("\nStack left running (`gyre down` stops it).")
        else:
            say(f"\nStopped: {', '.join(down(kernel))}")
    return 0
