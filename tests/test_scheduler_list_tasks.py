"""ListTasks on a real scheduler (NATS, Postgres): pages in submission order, a state filter, and
bad input refused naming the field."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from gyre.devstack.scratch import scratch_kernel
from gyre.rpc import ERROR_FIELD_TRAILER
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build

pytestmark = pytest.mark.asyncio(loop_scope="session")
SPEC = {"family": "terminal", "prompt": "2+2?", "group_size": 2, "timeout_s": 60, "harness": "gyre-agent"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def five(
    server_urls: tuple[str, str],
) -> AsyncIterator[tuple[scheduler_pb2_grpc.SchedulerServiceAsyncStub, list[str]]]:
    """A scheduler (no cells: nothing is admitted) holding tasks t0..t4, t2 cancelled."""
    async with scratch_kernel(*server_urls, label="list_tasks") as kernel:
        host: ServiceHost = await build(SchedulerSettings(port=0), kernel)
        await host.start()
        channel = grpc.aio.insecure_channel(host.address)
        stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
        try:
            ids = []
            for i in range(5):  # one request each: submission order is the order asked for
                request = pb.SubmitTasksRequest(
                    request_id=f"list-{uuid.uuid4().hex[:8]}", tasks=[pb.TaskSpec(name=f"t{i}", **SPEC)]
                )
                ids.append((await stub.SubmitTasks(request)).tasks[0].task_id)
            await stub.CancelTask(
                pb.CancelTaskRequest(request_id=f"c-{uuid.uuid4().hex[:8]}", task_id=ids[2])
            )
            yield stub, ids  # type: ignore[misc]
        finally:
            await channel.close()
            await host.stop(grace_s=1)


async def test_pages_follow_submission_order_until_the_last(
    five: tuple[scheduler_pb2_grpc.SchedulerServiceAsyncStub, list[str]],
) -> None:
    stub, ids = five
    seen, token, pages = [], "", 0
    while True:
        page = await stub.ListTasks(pb.ListTasksRequest(page_size=2, page_token=token))
        seen += [t.task_id for t in page.tasks]
        pages, token = pages + 1, page.next_page_token
        if not token:
            break
    assert seen == ids and pages == 3
    first = await stub.ListTasks(pb.ListTasksRequest(page_size=1))
    assert first.tasks[0].spec.name == "t0" and len(first.tasks[0].executions) == 2


async def test_a_state_filter_pages_over_that_state_only(
    five: tuple[scheduler_pb2_grpc.SchedulerServiceAsyncStub, list[str]],
) -> None:
    stub, ids = five
    cancelled = await stub.ListTasks(pb.ListTasksRequest(state=pb.TASK_STATE_CANCELLED))
    assert [(t.task_id, t.state) for t in cancelled.tasks] == [(ids[2], pb.TASK_STATE_CANCELLED)]
    assert not cancelled.next_page_token
    first = await stub.ListTasks(pb.ListTasksRequest(state=pb.TASK_STATE_PENDING, page_size=3))
    rest = await stub.ListTasks(
        pb.ListTasksRequest(state=pb.TASK_STATE_PENDING, page_size=3, page_token=first.next_page_token)
    )
    assert [t.task_id for t in [*first.tasks, *rest.tasks]] == [ids[0], ids[1], ids[3], ids[4]]
    assert not rest.next_page_token


async def refused(stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub, request: pb.ListTasksRequest) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListTasks(request)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return dict(err.value.trailing_metadata() or ())[ERROR_FIELD_TRAILER]  # type: ignore[arg-type,no-any-return]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"state": 99}, "state"),
        ({"page_size": 1001}, "page_size"),
        ({"page_token": "not-a-token"}, "page_token"),
        ({"page_token": "v1.x.0"}, "page_token"),
    ],
)
async def test_bad_input_is_refused_naming_the_field(
    five: tuple[scheduler_pb2_grpc.SchedulerServiceAsyncStub, list[str]],
    fields: dict[str, object],
    field: str,
) -> None:
    assert await refused(five[0], pb.ListTasksRequest(**fields)) == field  # type: ignore[arg-type]


async def test_a_token_is_refused_with_another_state_filter(
    five: tuple[scheduler_pb2_grpc.SchedulerServiceAsyncStub, list[str]],
) -> None:
    stub, _ = five
    token = (await stub.ListTasks(pb.ListTasksRequest(page_size=1))).next_page_token
    request = pb.ListTasksRequest(state=pb.TASK_STATE_PENDING, page_token=token)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.ListTasks(request)
    assert "made for every state" in (err.value.details() or "")
