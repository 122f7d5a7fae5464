"""A group is ready only once every call the proxy recorded for its executions is stored.

Real NATS and Postgres: the trajectory service consumes the scheduler's, the evaluator's and the
proxy's events, which arrive in any order across streams.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
import pytest_asyncio
from google.protobuf import message

from gyre.bus import DEAD_LETTER_SERVICE, Bus, BusConfig, dead_letter_subject
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build
from tests.trainer_stack import eventually

pytestmark = pytest.mark.asyncio(loop_scope="session")
Stub = trajectory_pb2_grpc.TrajectoryServiceStub


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(server_urls: tuple[str, str]) -> AsyncIterator[tuple[Stub, Bus]]:
    """A database and bus prefix of its own: the events published here reach no other test."""
    async with scratch_kernel(*server_urls, label="accounting") as kernel:
        host: ServiceHost = await build(TrajectorySettings(port=0), kernel)
        await host.start()
        assert kernel.nats_url is not None
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
        channel = grpc.aio.insecure_channel(host.address)
        yield Stub(channel), bus
        await channel.close()
        await bus.close()
        await host.stop()


def call(
    execution_id: str, call_id: str, output: Sequence[int], *, prompt: Sequence[int], parent: str = ""
) -> proxy_events.LlmCallRecorded:
    record = proxy_pb2.CallRecord(
        execution_id=execution_id,
        call_id=call_id,
        agent_role=proxy_pb2.AGENT_ROLE_MAIN,
        agent_id="main",
        output_ids=list(output),
        output_logprobs=[-0.5] * len(output),
        engine_id="cell-1",
    )
    if parent:
        record.prompt_delta.parent_call_id = parent
        record.prompt_delta.num_shared_tokens = 3
        record.prompt_delta.new_ids.extend(prompt)
    else:
        record.full_prompt.prompt_ids.extend(prompt)
    return proxy_events.LlmCallRecorded(call=record)


async def publish(bus: Bus, payload: message.Message, producer: str, task_id: str) -> None:
    await bus.publish(new_event(payload, producer=producer, correlation_id=task_id))


async def submit(bus: Bus, executions: Sequence[str], *, max_infra_retries: int | None = None) -> str:
    task_id = str(uuid.uuid4())
    task = scheduler_pb2.Task(
        task_id=task_id,
        spec=scheduler_pb2.TaskSpec(
            family="terminal", group_size=len(executions), max_infra_retries=max_infra_retries
        ),
        executions=[
            ids_pb2.ExecutionRef(task_id=task_id, execution_id=e, index_in_group=i)
            for i, e in enumerate(executions)
        ],
    )
    await publish(bus, scheduler_events.TaskSubmitted(task=task), "scheduler", task_id)
    return task_id


async def reward(
    bus: Bus, task_id: str, execution_id: str, *, num_calls: int | None, assessable: bool = True
) -> None:
    grade = evaluator_pb2.Grade(execution_id=execution_id, task_id=task_id, score=0.5, assessable=assessable)
    event = evaluator_events.RewardAssigned(grade=grade, num_calls_recorded=num_calls)
    await publish(bus, event, "evaluator", task_id)


async def group(stub: Stub, task_id: str) -> trajectory_pb2.Group | None:
    try:
        return (await stub.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))).group
    except grpc.aio.AioRpcError as err:
        assert err.code() == grpc.StatusCode.NOT_FOUND, err
        return None


async def rewarded(stub: Stub, task_id: str) -> bool:
    found = await group(stub, task_id)
    return found is not None and all(e.has_reward for e in found.executions)


async def is_ready(stub: Stub, task_id: str) -> bool:
    found = await group(stub, task_id)
    return found is not None and found.ready


async def ready_events(bus: Bus, task_id: str) -> list[trajectory_events.GroupReady]:
    await bus.ensure_stream("trajectory")
    sub = await bus.js.subscribe(f"{bus.prefix}.trajectory.v1.GroupReady", ordered_consumer=True)
    out: list[trajectory_events.GroupReady] = []
    try:
        for _ in range(200):  # bounded: the stream holds at most this test session's groups
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            event = trajectory_events.GroupReady()
            envelope_pb2.Envelope.FromString(msg.data).payload.Unpack(event)
            if event.task_id == task_id:
                out.append(event)
    finally:
        await sub.unsubscribe()
    return out


async def test_calls_stored_after_the_rewards_hold_the_group_until_the_last_one(
    service: tuple[Stub, Bus],
) -> None:
    stub, bus = service
    e1, e2 = str(uuid.uuid4()), str(uuid.uuid4())
    task_id = await submit(bus, [e1, e2])
    await reward(bus, task_id, e1, num_calls=2)
    await reward(bus, task_id, e2, num_calls=0)  # failed before its first model call
    await eventually(lambda: rewarded(stub, task_id), timeout_s=15, what="both rewards stored")
    await publish(bus, call(e1, str(uuid.uuid4()), [100], prompt=[1, 2]), "proxy", task_id)
    await asyncio.sleep(1.0)
    assert not await is_ready(stub, task_id)  # one of e1's two recorded calls is still on the bus
    assert await ready_events(bus, task_id) == []

    await publish(bus, call(e1, str(uuid.uuid4()), [101], prompt=[5, 6]), "proxy", task_id)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=15, what="the group ready")
    events = await ready_events(bus, task_id)
    assert [list(e.execution_ids) for e in events] == [[e1, e2]]
    samples = [
        r.sample async for r in stub.StreamSamples(trajectory_pb2.StreamSamplesRequest(task_ids=[task_id]))
    ]
    assert [s.execution_id for s in samples] == [e1, e1]  # e2 made no call: no sample, still a member


async def test_a_reward_without_a_count_does_not_wait_for_calls(service: tuple[Stub, Bus]) -> None:
    """GradeWorkspace rewards, or a runner that could not reach the proxy, carry no count."""
    stub, bus = service
    e1 = str(uuid.uuid4())
    task_id = await submit(bus, [e1])
    await reward(bus, task_id, e1, num_calls=None)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=15, what="the group ready")


async def test_a_delta_whose_parent_comes_later_waits_for_it_instead_of_being_dead_lettered(
    service: tuple[Stub, Bus],
) -> None:
    stub, bus = service
    e1 = str(uuid.uuid4())
    task_id = await submit(bus, [e1])
    parent, child = str(uuid.uuid4()), str(uuid.uuid4())
    await publish(bus, call(e1, child, [102], prompt=[7], parent=parent), "proxy", task_id)
    await asyncio.sleep(0.5)
    await publish(bus, call(e1, parent, [100], prompt=[1, 2]), "proxy", task_id)
    await reward(bus, task_id, e1, num_calls=2)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=30, what="the group ready with both calls")
    got = (await stub.GetCall(trajectory_pb2.GetCallRequest(call_id=child))).call
    assert list(got.full_prompt.prompt_ids) == [1, 2, 100, 7]

    await bus.ensure_stream(DEAD_LETTER_SERVICE)
    sub = await bus.js.subscribe(
        dead_letter_subject("trajectory-calls", prefix=bus.prefix), ordered_consumer=True
    )
    try:
        reasons = []
        for _ in range(100):  # bounded
            try:
                msg = await sub.next_msg(timeout=0.5)
            except TimeoutError:
                break
            reasons.append(envelope_pb2.DeadLetter.FromString(msg.data).reason)
    finally:
        await sub.unsubscribe()
    assert not [r for r in reasons if child in r or parent in r], reasons


async def test_a_call_refused_for_good_counts_so_its_group_does_not_wait_forever(
    service: tuple[Stub, Bus],
) -> None:
    stub, bus = service
    e1 = str(uuid.uuid4())
    task_id = await submit(bus, [e1])
    good, bad = str(uuid.uuid4()), str(uuid.uuid4())
    await publish(bus, call(e1, good, [100], prompt=[1, 2]), "proxy", task_id)
    refused = call(e1, bad, [101], prompt=[7], parent=good)
    refused.call.prompt_delta.num_shared_tokens = 99  # the parent has 3 tokens: dead-lettered
    await publish(bus, refused, "proxy", task_id)
    await reward(bus, task_id, e1, num_calls=2)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=15, what="the group ready without it")
    samples = [
        r.sample async for r in stub.StreamSamples(trajectory_pb2.StreamSamplesRequest(task_ids=[task_id]))
    ]
    assert [list(s.token_ids) for s in samples] == [[1, 2, 100]]


def decided(
    task_id: str, failed: str, *, replacement: str = ""
) -> scheduler_events.ExecutionReplacementDecided:
    """The scheduler's word on an unassessable member at index 1: its replacement at index 2, or none."""
    event = scheduler_events.ExecutionReplacementDecided(
        execution=ids_pb2.ExecutionRef(task_id=task_id, execution_id=failed, index_in_group=1),
        reason="the sandbox could not be created",
        max_infra_retries=1,
    )
    if replacement:
        event.replacement.CopyFrom(
            ids_pb2.ExecutionRef(task_id=task_id, execution_id=replacement, index_in_group=2)
        )
    return event


async def test_an_unassessable_member_holds_its_group_until_its_replacement_is_rewarded(
    service: tuple[Stub, Bus],
) -> None:
    stub, bus = service
    e1, e2, spare = (str(uuid.uuid4()) for _ in range(3))
    task_id = await submit(bus, [e1, e2], max_infra_retries=1)
    await reward(bus, task_id, e1, num_calls=None)
    await reward(bus, task_id, e2, num_calls=None, assessable=False)
    await eventually(lambda: rewarded(stub, task_id), timeout_s=30, what="both rewards stored")
    assert not await is_ready(stub, task_id)  # the scheduler's decision is still out

    await publish(bus, decided(task_id, e2, replacement=spare), "scheduler", task_id)

    async def replacement_joined() -> bool:
        found = await group(stub, task_id)
        return found is not None and found.num_replacements == 1

    await eventually(replacement_joined, timeout_s=30, what="the replacement in the group")
    assert not await is_ready(stub, task_id)  # now it waits for the replacement's reward
    await reward(bus, task_id, spare, num_calls=None)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=30, what="the group ready")
    [ready] = await ready_events(bus, task_id)
    assert list(ready.execution_ids) == [e1, e2, spare] and list(ready.unassessable_execution_ids) == [e2]


async def test_no_replacement_decided_lets_the_group_train_without_it(service: tuple[Stub, Bus]) -> None:
    """Whichever comes first, the decision (scheduler) or the grade (evaluator): their streams are
    not ordered with each other."""
    stub, bus = service
    e1, e2 = str(uuid.uuid4()), str(uuid.uuid4())
    task_id = await submit(bus, [e1, e2], max_infra_retries=1)
    await publish(bus, decided(task_id, e2), "scheduler", task_id)
    await reward(bus, task_id, e1, num_calls=None)
    await reward(bus, task_id, e2, num_calls=None, assessable=False)
    await eventually(lambda: is_ready(stub, task_id), timeout_s=30, what="the group ready")
    found = await group(stub, task_id)
    assert found is not None and (found.num_unassessable, found.num_replacements) == (1, 0)
