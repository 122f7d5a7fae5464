"""The vertical slice on real NATS and Postgres: SubmitTasks -> TaskSubmitted -> trajectory group."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio
import sqlalchemy as sa

from gyre.db.engine import make_engine
from gyre.devstack.scratch import scratch_kernel
from gyre.events import stream_name
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")


@dataclass
class Slice:
    scheduler: scheduler_pb2_grpc.SchedulerServiceStub
    trajectory: trajectory_pb2_grpc.TrajectoryServiceStub
    scheduler_channel: grpc.aio.Channel
    kernel: KernelSettings


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def slice_(server_urls: tuple[str, str]) -> AsyncIterator[Slice]:
    # A database and bus prefix of its own: the tests below count every event on the scheduler's
    # stream, which other modules' schedulers (and their outbox rows) would otherwise add to.
    async with scratch_kernel(*server_urls, label="slice") as kernel:
        hosts: list[ServiceHost] = [
            await build_scheduler(SchedulerSettings(port=0), kernel),
            await build_trajectory(TrajectorySettings(port=0), kernel),
        ]
        for host in hosts:
            await host.start()
        channels = [grpc.aio.insecure_channel(h.address) for h in hosts]
        yield Slice(
            scheduler=scheduler_pb2_grpc.SchedulerServiceStub(channels[0]),
            trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channels[1]),
            scheduler_channel=channels[0],
            kernel=kernel,
        )
        for channel in channels:
            await channel.close()
        for host in hosts:
            await host.stop()


def spec(**change: object) -> scheduler_pb2.TaskSpec:
    fields: dict[str, object] = {
        "name": "fizzbuzz",
        "family": "repo_generation",
        "prompt": "Write fizzbuzz with tests.",
        "group_size": 3,
        "timeout_s": 600.0,
        "harness": "gyre-agent",
        "labels": {"split": "train"},
    }
    fields.update(change)
    return scheduler_pb2.TaskSpec(**fields)  # type: ignore[arg-type]


async def wait_for_group(s: Slice, task_id: str) -> trajectory_pb2.Group:
    for _ in range(100):  # bounded: 10 s
        try:
            return (await s.trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))).group
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND, err
        await asyncio.sleep(0.1)
    raise AssertionError(f"trajectory never learned of task {task_id}")


async def count_rows(kernel: KernelSettings, table: str) -> int:
    assert kernel.database_url is not None
    engine = make_engine(kernel.database_url)
    try:
        async with engine.connect() as conn:
            return int((await conn.execute(sa.text(f"SELECT count(*) FROM {table}"))).scalar_one())
    finally:
        await engine.dispose()


async def stream_messages(s: Slice, service: str) -> int:
    import nats

    assert s.kernel.nats_url is not None
    nc = await nats.connect(s.kernel.nats_url)
    try:
        info = await nc.jetstream().stream_info(stream_name(service, prefix=s.kernel.bus_prefix))
        return int(info.state.messages)
    finally:
        await nc.close()


async def test_a_submitted_task_reaches_the_trajectory_service(slice_: Slice) -> None:
    answer = await slice_.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(
            request_id="slice-1", tasks=[spec(), spec(name="second", group_size=1)]
        )
    )
    assert [len(t.executions) for t in answer.tasks] == [3, 1]
    task = answer.tasks[0]
    stored = (await slice_.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id=task.task_id))).task
    assert stored == task
    assert stored.state == scheduler_pb2.TASK_STATE_PENDING

    group = await wait_for_group(slice_, task.task_id)
    assert group.group_size == 3 and group.family == "repo_generation" and not group.ready
    assert [e.execution_id for e in group.executions] == [e.execution_id for e in task.executions]


async def test_a_repeated_request_id_returns_the_first_answer(slice_: Slice) -> None:
    request = scheduler_pb2.SubmitTasksRequest(request_id="slice-repeat", tasks=[spec()])
    first = await slice_.scheduler.SubmitTasks(request)
    tasks_before = await count_rows(slice_.kernel, "scheduler.tasks")
    again = await asyncio.gather(*(slice_.scheduler.SubmitTasks(request) for _ in range(3)))
    assert all(a == first for a in again)
    assert await count_rows(slice_.kernel, "scheduler.tasks") == tasks_before


async def test_concurrent_first_calls_with_one_request_id_create_one_batch(slice_: Slice) -> None:
    request = scheduler_pb2.SubmitTasksRequest(request_id="slice-race", tasks=[spec()])
    before = await count_rows(slice_.kernel, "scheduler.tasks")
    answers = await asyncio.gather(*(slice_.scheduler.SubmitTasks(request) for _ in range(4)))
    assert all(a == answers[0] for a in answers)
    assert await count_rows(slice_.kernel, "scheduler.tasks") == before + 1


async def test_a_reused_request_id_with_another_body_is_refused(slice_: Slice) -> None:
    await slice_.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(request_id="slice-reuse", tasks=[spec()])
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await slice_.scheduler.SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(request_id="slice-reuse", tasks=[spec(group_size=5)])
        )
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "slice-reuse" in (err.value.details() or "")


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (scheduler_pb2.SubmitTasksRequest(tasks=[spec()]), "request_id"),
        (scheduler_pb2.SubmitTasksRequest(request_id="bad-empty"), "tasks"),
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-1", tasks=[spec(), spec(group_size=0)]),
            "tasks[1].group_size",
        ),
        (scheduler_pb2.SubmitTasksRequest(request_id="bad-2", tasks=[spec(name="")]), "tasks[0].name"),
        (
            scheduler_pb2.SubmitTasksRequest(
                request_id="bad-3", tasks=[spec(prompt="x" * (1024 * 1024 + 1))]
            ),
            "tasks[0].prompt",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-4", tasks=[spec(timeout_s=-1.0)]),
            "tasks[0].timeout_s",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-5", tasks=[spec(family="Not A Family")]),
            "tasks[0].family",
        ),
        # Checkable at submission, so refused then rather than run and failed (issue 18):
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-6", tasks=[spec(harness="codex")]),
            "tasks[0].harness",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-7", tasks=[spec(family="poetry")]),
            "tasks[0].family",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(
                request_id="bad-8", tasks=[spec(workspace_template="task:no-such-task")]
            ),
            "tasks[0].workspace_template",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(
                request_id="bad-9", tasks=[spec(family="terminal", workspace_template="task:slugfix")]
            ),
            "tasks[0].workspace_template",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(
                request_id="bad-10", tasks=[spec(workspace_template="https://example.com/repo.tar.gz")]
            ),
            "tasks[0].workspace_template",
        ),
        (
            scheduler_pb2.SubmitTasksRequest(request_id="bad-11", tasks=[spec(prompt="fix\x00 this")]),
            "tasks[0].prompt",
        ),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_nothing_is_kept(
    slice_: Slice, request_: scheduler_pb2.SubmitTasksRequest, field: str
) -> None:
    tasks_before = await count_rows(slice_.kernel, "scheduler.tasks")
    outbox_before = await count_rows(slice_.kernel, "scheduler.outbox")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await slice_.scheduler.SubmitTasks(request_)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}: ")
    assert dict(err.value.trailing_metadata() or ())["gyre-error-field"] == field
    assert await count_rows(slice_.kernel, "scheduler.tasks") == tasks_before
    assert await count_rows(slice_.kernel, "scheduler.outbox") == outbox_before
    # The id of a refused request stays free for the corrected request.
    assert await count_rows(slice_.kernel, "scheduler.rpc_requests WHERE request_id LIKE 'bad-%'") == 0


async def test_a_body_that_is_not_protobuf_is_invalid_argument_and_service_keeps_serving(
    slice_: Slice,
) -> None:
    raw = slice_.scheduler_channel.unary_unary(
        "/gyre.scheduler.v1.SchedulerService/SubmitTasks",
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await raw(b"\x0a\xff\xff\xff\xff")  # field 1 claims a length far past the end
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "not a valid protobuf" in (err.value.details() or "")
    ok = await slice_.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(request_id="after-garbage", tasks=[spec()])
    )
    assert len(ok.tasks) == 1


async def test_unknown_and_malformed_ids_in_queries(slice_: Slice) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await slice_.scheduler.GetTask(scheduler_pb2.GetTaskRequest(task_id="nope"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await slice_.scheduler.GetTask(
            scheduler_pb2.GetTaskRequest(task_id="01938d6e-0000-7000-8000-000000000000")
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_every_accepted_task_is_published_once(slice_: Slice) -> None:
    await slice_.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(request_id="count-1", tasks=[spec()] * 3)
    )
    tasks = await count_rows(slice_.kernel, "scheduler.tasks")
    for _ in range(50):  # bounded: the relay publishes within its poll interval
        if await count_rows(slice_.kernel, "scheduler.outbox WHERE published_at IS NULL") == 0:
            break
        await asyncio.sleep(0.1)
    # one TaskSubmitted per task; ExecutionScheduled waits for the policy to admit the task, and
    # with no cell registered here it never does
    assert await stream_messages(slice_, "scheduler") == tasks
