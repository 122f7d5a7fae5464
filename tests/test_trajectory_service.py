"""The trajectory service on real NATS and Postgres: calls and rewards from the bus, GroupReady out."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc
import nats
import pytest
import pytest_asyncio
from google.protobuf import message

from gyre.bus import Bus, BusConfig, dead_letter_subject
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event, stream_name
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build

pytestmark = pytest.mark.asyncio(loop_scope="session")
MAIN = proxy_pb2.AGENT_ROLE_MAIN


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def service(
    kernel: KernelSettings,
) -> AsyncIterator[tuple[trajectory_pb2_grpc.TrajectoryServiceStub, Bus]]:
    host: ServiceHost = await build(TrajectorySettings(port=0), kernel)
    await host.start()
    assert kernel.nats_url is not None
    bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
    channel = grpc.aio.insecure_channel(host.address)
    yield trajectory_pb2_grpc.TrajectoryServiceStub(channel), bus
    await channel.close()
    await bus.close()
    await host.stop()


def record(
    execution_id: str,
    call_id: str,
    output: Sequence[int],
    *,
    prompt: Sequence[int] = (),
    delta: tuple[str, int] | None = None,
) -> proxy_pb2.CallRecord:
    call = proxy_pb2.CallRecord(
        execution_id=execution_id,
        call_id=call_id,
        agent_role=MAIN,
        agent_id="main",
        output_ids=list(output),
        output_logprobs=[-0.25] * len(output),
        engine_id="cell-1",
    )
    call.policy_version.steps = 3
    if delta is None:
        call.full_prompt.prompt_ids.extend(prompt)
    else:
        call.prompt_delta.parent_call_id, call.prompt_delta.num_shared_tokens = delta
        call.prompt_delta.new_ids.extend(prompt)
    return call


async def publish(bus: Bus, payload: message.Message, producer: str, correlation_id: str) -> None:
    await bus.publish(new_event(payload, producer=producer, correlation_id=correlation_id))


async def submit_group(bus: Bus, task_id: str, family: str, members: Sequence[str]) -> None:
    task = scheduler_pb2.Task(
        task_id=task_id,
        spec=scheduler_pb2.TaskSpec(family=family, group_size=len(members)),
        executions=[
            ids_pb2.ExecutionRef(task_id=task_id, execution_id=e, index_in_group=i)
            for i, e in enumerate(members)
        ],
    )
    await publish(bus, scheduler_events.TaskSubmitted(task=task), "scheduler", task_id)


async def eventually_tree(
    stub: trajectory_pb2_grpc.TrajectoryServiceStub, execution_id: str, num_calls: int
) -> trajectory_pb2.ExecutionTree:
    for _ in range(100):  # bounded: 10 s
        try:
            tree = (
                await stub.GetExecutionTree(trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id))
            ).tree
            if len(tree.calls) >= num_calls:
                return tree
        except grpc.aio.AioRpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND, err
        await asyncio.sleep(0.1)
    raise AssertionError(f"execution {execution_id} never reached {num_calls} calls")


async def stream_payloads(bus: Bus, service: str, subject: str) -> list[bytes]:
    nc = await nats.connect(bus.nc.connected_url.geturl() if bus.nc.connected_url else "")
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(subject, stream=stream_name(service, prefix=bus.prefix))
        try:
            msgs = await sub.fetch(20, timeout=1.0)
        except (TimeoutError, nats.errors.TimeoutError):
            return []
        return [m.data for m in msgs]
    finally:
        await nc.close()


async def test_calls_and_rewards_from_the_bus_make_a_ready_group_and_samples(
    service: tuple[trajectory_pb2_grpc.TrajectoryServiceStub, Bus],
) -> None:
    stub, bus = service
    task_id, e1, e2 = (str(uuid.uuid4()) for _ in range(3))
    await submit_group(bus, task_id, "repo_generation", (e1, e2))
    c0, c1, d0 = (str(uuid.uuid4()) for _ in range(3))
    for call in (
        record(e1, c0, [100, 101], prompt=[1, 2]),
        record(e1, c1, [102], prompt=[3], delta=(c0, 4)),
        record(e1, c1, [102], prompt=[3], delta=(c0, 4)),  # re-sent under a new event id: no change
        record(e1, str(uuid.uuid4()), [103], prompt=[4], delta=(c0, 99)),  # dead-lettered: c0 has 4
        record(e2, d0, [110], prompt=[1, 2]),
    ):
        await publish(bus, proxy_events.LlmCallRecorded(call=call), "proxy", task_id)

    tree = await eventually_tree(stub, e1, 2)
    await eventually_tree(stub, e2, 1)
    assert [c.num_shared_prompt_tokens for c in tree.calls] == [0, 4]
    assert (tree.num_unique_tokens, tree.num_flat_tokens, tree.num_target_tokens) == (6, 4 + 6, 3)
    assert [t.selected for t in tree.trajectories] == [True]

    got = (await stub.GetCall(trajectory_pb2.GetCallRequest(call_id=c1))).call
    assert list(got.full_prompt.prompt_ids) == [1, 2, 100, 101, 3] and list(got.output_ids) == [102]
    assert got.policy_version.steps == 3 and got.engine_id == "cell-1"

    dead = await stream_payloads(
        bus, "deadletter", dead_letter_subject("trajectory-calls", prefix=bus.prefix)
    )
    reasons = [envelope_pb2.DeadLetter.FromString(d).reason for d in dead]
    assert any("99 shared tokens, but call" in r for r in reasons), reasons

    for execution_id, score, assessable in ((e1, 1.0, True), (e2, 0.0, True)):
        grade = evaluator_pb2.Grade(
            execution_id=execution_id, task_id=task_id, score=score, assessable=assessable
        )
        await publish(bus, evaluator_events.RewardAssigned(grade=grade), "evaluator", task_id)
    # a second reward for e1 changes nothing and publishes nothing
    grade = evaluator_pb2.Grade(execution_id=e1, task_id=task_id, score=0.0, assessable=True)
    await publish(bus, evaluator_events.RewardAssigned(grade=grade), "evaluator", task_id)

    for _ in range(100):
        group = (await stub.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))).group
        if group.ready:
            break
        await asyncio.sleep(0.1)
    assert group.ready and [e.reward for e in group.executions] == [1.0, 0.0]

    ready: list[trajectory_events.GroupReady] = []
    for _ in range(30):
        payloads = await stream_payloads(bus, "trajectory", f"{bus.prefix}.trajectory.v1.GroupReady")
        ready = []
        for data in payloads:
            env = envelope_pb2.Envelope.FromString(data)
            event = trajectory_events.GroupReady()
            env.payload.Unpack(event)
            if event.task_id == task_id:
                ready.append(event)
        if ready:
            break
        await asyncio.sleep(0.2)
    assert [list(r.execution_ids) for r in ready] == [[e1, e2]]

    samples = [
        r.sample async for r in stub.StreamSamples(trajectory_pb2.StreamSamplesRequest(task_ids=[task_id]))
    ]
    assert [(s.execution_id, list(s.token_ids), list(s.loss_mask)) for s in samples] == [
        (e1, [1, 2, 100, 101, 3, 102], [False, False, True, True, False, True]),
        (e2, [1, 2, 110], [False, False, True]),
    ]
    assert [round(s.advantage, 4) for s in samples] == [1.0, -1.0]
    assert sum(sum(s.token_weight) for s in samples) == pytest.approx(1.0)
    assert list(samples[0].token_weight)[2] == pytest.approx(1 / (2 * 3))
    assert list(samples[0].policy_versions) == [0, 0, 3, 3, 0, 3]


async def ready_event(bus: Bus, task_id: str) -> trajectory_events.GroupReady:
    for _ in range(50):  # bounded: about 10 s
        for data in await stream_payloads(bus, "trajectory", f"{bus.prefix}.trajectory.v1.GroupReady"):
            env = envelope_pb2.Envelope.FromString(data)
            event = trajectory_events.GroupReady()
            env.payload.Unpack(event)
            if event.task_id == task_id:
                return event
        await asyncio.sleep(0.2)
    raise AssertionError(f"no GroupReady for task {task_id}")


async def test_an_unassessable_execution_is_kept_out_of_the_baseline_and_the_loss(
    service: tuple[trajectory_pb2_grpc.TrajectoryServiceStub, Bus],
) -> None:
    """An infrastructure failure completes the group but is neither a 0 in the baseline nor trained on."""
    stub, bus = service
    task_id, good, partial, crashed = (str(uuid.uuid4()) for _ in range(4))
    members = (good, partial, crashed)
    await submit_group(bus, task_id, "repo_repair", members)
    for e in members:
        await publish(
            bus,
            proxy_events.LlmCallRecorded(call=record(e, str(uuid.uuid4()), [50, 51], prompt=[1])),
            "proxy",
            task_id,
        )
        await eventually_tree(stub, e, 1)
    # A timeout with partial credit is a policy outcome (scored as earned); a crashed grader is not.
    for e, score, assessable, is_partial in (
        (good, 1.0, True, False),
        (partial, 0.4, True, True),
        (crashed, 0.0, False, False),
    ):
        grade = evaluator_pb2.Grade(
            execution_id=e, task_id=task_id, score=score, assessable=assessable, partial=is_partial
        )
        await publish(bus, evaluator_events.RewardAssigned(grade=grade), "evaluator", task_id)

    ready = await ready_event(bus, task_id)
    assert list(ready.execution_ids) == list(members) and list(ready.unassessable_execution_ids) == [crashed]
    group = (await stub.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))).group
    assert [e.assessable for e in group.executions] == [True, True, False] and group.num_unassessable == 1

    samples = [
        r.sample async for r in stub.StreamSamples(trajectory_pb2.StreamSamplesRequest(task_ids=[task_id]))
    ]
    # Baseline over {1.0, 0.4}: mean 0.7, std 0.3. With the crash counted as 0 it would be
    # mean 0.467 and the partial execution's advantage would turn from -1 to about -0.16.
    assert [s.execution_id for s in samples] == [good, partial]
    assert [round(s.advantage, 4) for s in samples] == [1.0, -1.0]
    assert sum(sum(s.token_weight) for s in samples) == pytest.approx(1.0)


async def test_bad_requests_name_what_is_wrong(
    service: tuple[trajectory_pb2_grpc.TrajectoryServiceStub, Bus],
) -> None:
    stub, _ = service
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.GetCall(trajectory_pb2.GetCallRequest(call_id="nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.StreamSamples(
            trajectory_pb2.StreamSamplesRequest(execution_ids=["x"], role_rank=["boss"])
        ):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "role_rank[0]" in (
        err.value.details() or ""
    )
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.StreamSamples(trajectory_pb2.StreamSamplesRequest(task_ids=[str(uuid.uuid4())])):
            pass
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_group_registered_while_its_last_reward_commits_still_becomes_ready(
    kernel: KernelSettings, service: tuple[trajectory_pb2_grpc.TrajectoryServiceStub, Bus]
) -> None:
    """TaskSubmitted and the last RewardAssigned come on different streams and can commit together."""
    from services.trajectory import repo

    assert kernel.database_url is not None
    engine = make_engine(kernel.database_url)
    sessions = make_sessionmaker(engine)
    task_id, execution_id = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        async with sessions() as registering, sessions() as rewarding:
            await registering.begin()
            await repo.register_group(registering, task_id=task_id, family="f", members=[(execution_id, 0)])
            assert await repo.mark_ready_if_complete(registering, task_id) is None  # no reward visible yet

            async def reward() -> list[str] | None:
                async with rewarding.begin():
                    await repo.record_reward(
                        rewarding,
                        execution_id=execution_id,
                        task_id=task_id,
                        reward=1.0,
                        assessable=True,
                        partial=False,
                    )
                    return await repo.mark_ready_if_complete(rewarding, task_id)

            pending = asyncio.create_task(reward())
            await asyncio.sleep(0.5)
            assert not pending.done()  # waits for the registration to commit instead of missing it
            await registering.commit()
            assert await asyncio.wait_for(pending, timeout=10) == [execution_id]
    finally:
        await engine.dispose()
