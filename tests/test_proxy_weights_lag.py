"""Bounded staleness for every token: a call of an execution admitted at version v is generated
only by weights of version v or newer. A real torch engine (tiny model) lags a weight update; the
call waits at the proxy until the engine has loaded v, its recorded tokens carry v, and the
trainer's own staleness rule, applied to the samples the trajectory service replays from them,
sees a lag of at most K and drops nothing (real NATS and Postgres)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
import pytest_asyncio
from proxy_support import Rig, greedy_stream, start_rig

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.proxy.v1 import proxy_pb2
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from tests.grpc_wait import once_found

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]
K = 1
"""The scheduler's staleness bound in these checks: admitted at v, trained by step v+K."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def lagging(kernel: KernelSettings, tiny_model: Path) -> AsyncIterator[tuple[Rig, ServiceHost, object]]:
    """The proxy, one torch engine that loads weights only when the test says so, the trajectory
    service; yields (rig, engine host, engine stub)."""
    from services.engine.config import EngineSettings
    from services.engine.main import build

    rig = await start_rig(kernel, tiny_model, num_engines=0)
    settings = EngineSettings(
        model_dir=tiny_model,
        engine_id="torch-lag",
        cell_id="cell-lag",
        num_threads=1,
        publish_events=False,
        follow_weights=False,  # the lag is the test's to end: it calls UpdateWeights
        init_model_if_missing=False,
    )
    host = await build(settings, kernel)
    await host.start()
    await rig.stub.RegisterEngine(
        proxy_pb2.RegisterEngineRequest(
            request_id=f"lag-{uuid.uuid4().hex[:8]}",
            cell_id="cell-lag",
            engine_id="torch-lag",
            address=host.address,
        )
    )
    channel = grpc.aio.insecure_channel(host.address)
    yield rig, host, engine_pb2_grpc.EngineServiceStub(channel)
    await channel.close(None)
    await host.stop(grace_s=1)
    await rig.close()


async def register(rig: Rig, *, min_version: int) -> tuple[str, str]:
    """A token of a new execution admitted at `min_version`."""
    token, execution_id = f"gyre-{uuid.uuid4().hex}{uuid.uuid4().hex}", str(uuid.uuid4())
    request = proxy_pb2.RegisterExecutionTokenRequest(request_id=f"reg-{execution_id}", token=token)
    request.execution.execution_id = execution_id
    request.execution.task_id = str(uuid.uuid4())
    request.min_policy_version.steps = min_version
    request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    await rig.stub.RegisterExecutionToken(request)
    return token, execution_id


async def loaded_version(engine: object) -> int:
    stats = await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())  # type: ignore[attr-defined]
    return int(stats.policy_version.steps)


async def load(engine: object, version: int, tiny_model: Path) -> None:
    """The engine catches up: weights of `version` (the same bytes: the version is what counts here)."""
    request = engine_pb2.UpdateWeightsRequest(
        request_id=f"w-{uuid.uuid4().hex[:8]}", source_uri=str(tiny_model), version={"steps": version}
    )
    await engine.UpdateWeights(request)  # type: ignore[attr-defined]


async def stream(rig: Rig, token: str, *, max_tokens: int, during: object = None) -> str:
    return await greedy_stream(rig.http_url, token, max_tokens=max_tokens, during=during)  # type: ignore[arg-type]


async def held(rig: Rig, call: asyncio.Future[object]) -> bool:
    """Whether the call reaches the proxy's wait for weights (and is still there)."""
    router = rig.proxy.calls.router
    for _ in range(300):  # bounded: 30 s for the call to reach the proxy's wait
        if router.num_waiting == 1 or call.done():
            break
        await asyncio.sleep(0.1)
    return router.num_waiting == 1 and not call.done()


def token_versions(record: proxy_pb2.CallRecord) -> list[int]:
    """Each output token's policy version (one version for all when the weights did not change)."""
    return list(record.output_policy_versions) or [record.policy_version.steps] * len(record.output_ids)


async def trainer_staleness(kernel: KernelSettings, execution_id: str, *, trainer_version: int) -> object:
    """The trainer's staleness rule on the samples the trajectory service replays for the execution."""
    from services.trainer.samples import StalenessAction, admit
    from services.trainer.source import sample_from_proto
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build

    host = await build(TrajectorySettings(port=0), kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
        request = trajectory_pb2.StreamSamplesRequest(execution_ids=[execution_id])

        async def fetch() -> list[Any]:
            return [sample_from_proto(r.sample) async for r in stub.StreamSamples(request)]

        samples = await once_found(fetch, what=f"execution {execution_id}")
    finally:
        await channel.close(None)
        await host.stop(grace_s=1)
    assert samples, "the execution's call replays into a sample"
    # FAIL, not DROP: a sample over the bound raises instead of quietly leaving the batch.
    return admit(samples, trainer_version=trainer_version, max_staleness_steps=K, action=StalenessAction.FAIL)


async def test_a_call_admitted_at_a_version_the_engine_lacks_waits_and_is_generated_with_it(
    lagging: tuple[Rig, ServiceHost, object], tiny_model: Path, kernel: KernelSettings
) -> None:
    rig, _, engine = lagging
    router = rig.proxy.calls.router
    v = await loaded_version(engine) + 1  # the trainer published v; the engine has not loaded it
    token, execution_id = await register(rig, min_version=v)
    sampled_before = (await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())).num_output_tokens  # type: ignore[attr-defined]
    call = asyncio.ensure_future(stream(rig, token, max_tokens=24))
    assert await held(rig, call), "the call waits for weights of version v"
    stats = await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())  # type: ignore[attr-defined]
    assert stats.num_output_tokens == sampled_before, "nothing was sampled with the old weights"
    await load(engine, v, tiny_model)
    text = await call
    assert text and router.num_waiting == 0
    (record,) = await rig.records(execution_id, at_least=1)
    assert record.policy_version.steps == v
    assert token_versions(record) == [v] * len(record.output_ids)
    admission = await trainer_staleness(kernel, execution_id, trainer_version=v + K)
    assert (admission.num_dropped, admission.staleness_max_steps) == (0, K)  # type: ignore[attr-defined]


async def test_a_call_whose_engine_loads_new_weights_mid_call_records_each_tokens_version(
    lagging: tuple[Rig, ServiceHost, object], tiny_model: Path, kernel: KernelSettings
) -> None:
    rig, _, engine = lagging
    v = await loaded_version(engine)
    token, execution_id = await register(rig, min_version=v)
    updated: list[bool] = []

    async def update_after_a_few_tokens(parts: list[str]) -> None:
        if not updated and len(parts) >= 6:
            await load(engine, v + 1, tiny_model)
            updated.append(True)

    await stream(rig, token, max_tokens=160, during=update_after_a_few_tokens)
    assert updated, "the weights changed while the call generated"
    (record,) = await rig.records(execution_id, at_least=1)
    versions = token_versions(record)
    # The tokens before the swap carry v, those after it v+1; the call's version is the oldest,
    # v (what staleness is measured from), never older than the admitted version.
    assert versions == sorted(versions) and versions[0] == v and versions[-1] == v + 1
    assert record.policy_version.steps == v
    admission = await trainer_staleness(kernel, execution_id, trainer_version=v + K)
    assert (admission.num_dropped, admission.staleness_max_steps) == (0, K)  # type: ignore[attr-defined]


async def test_a_call_that_outwaits_the_bound_gets_a_503_naming_the_version(
    lagging: tuple[Rig, ServiceHost, object],
) -> None:
    rig, _, engine = lagging
    router = rig.proxy.calls.router
    v = await loaded_version(engine)
    ahead, _ = await register(rig, min_version=v + 5)
    waited_s, router.version_wait_s = router.version_wait_s, 0.3
    try:
        with pytest.raises(openai.InternalServerError) as refused:
            await stream(rig, ahead, max_tokens=4)
    finally:
        router.version_wait_s = waited_s
    assert refused.value.status_code == 503
    assert f"policy version {v + 5} or newer" in str(refused.value)
    assert router.num_waiting == 0
    current, _ = await register(rig, min_version=v)
    assert await stream(rig, current, max_tokens=4), "the proxy keeps serving calls the engine can take"


async def test_an_engine_refuses_a_generation_needing_newer_weights_than_it_holds(
    lagging: tuple[Rig, ServiceHost, object],
) -> None:
    _, _, engine = lagging
    v = await loaded_version(engine)
    request = engine_pb2.GenerateTokensRequest(
        request_id=f"g-{uuid.uuid4().hex[:8]}",
        execution_id=str(uuid.uuid4()),
        prompt_ids=[1, 2, 3],
        sampling=engine_pb2.SamplingParams(temperature=0, top_p=1, max_tokens=2),
        min_policy_version={"steps": v + 1},
    )
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async for _ in engine.GenerateTokens(request):  # type: ignore[attr-defined]
            pass
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "min_policy_version" in (refused.value.details() or "")
    request.request_id, request.min_policy_version.steps = f"g-{uuid.uuid4().hex[:8]}", v
    pieces = [piece async for piece in engine.GenerateTokens(request)]  # type: ignore[attr-defined]
    assert all(v in piece.tokens.policy_versions for piece in pieces if piece.tokens.token_ids)


async def test_a_token_with_a_version_beyond_the_range_is_refused_naming_the_field(
    lagging: tuple[Rig, ServiceHost, object],
) -> None:
    rig, _, _ = lagging
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await register(rig, min_version=2**63)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "min_policy_version.steps" in (refused.value.details() or "")


async def test_an_engine_back_on_older_weights_than_the_proxy_knew_refuses_and_the_next_call_waits(
    lagging: tuple[Rig, ServiceHost, object], tiny_model: Path
) -> None:
    """The proxy's version of an engine is only ever too low, unless the engine restarted on older
    weights at the same address: then the engine's own check refuses, and the proxy asks again."""
    rig, _, engine = lagging
    router = rig.proxy.calls.router
    v = await loaded_version(engine) + 1
    router.observed_version("torch-lag", v)  # as if the engine had held v before a restart
    token, execution_id = await register(rig, min_version=v)
    client = openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)
    ask = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with pytest.raises(openai.InternalServerError) as refused:
        await client.chat.completions.create(**ask)  # type: ignore[call-overload]
    assert refused.value.status_code == 503 and "min_policy_version" in str(refused.value)
    # The refused call's record commits before the same request comes again: it must be a new
    # call then, not an answer replayed from that record (CI once got the empty one back).
    (record,) = await rig.records(execution_id, at_least=1)
    assert (record.finish_reason, len(record.output_ids)) == (proxy_pb2.CALL_FINISH_REASON_CANCELLED, 0)
    call = asyncio.ensure_future(client.chat.completions.create(**ask))  # type: ignore[call-overload]
    assert await held(rig, call), "the proxy asked the engine again and waits"
    await load(engine, v, tiny_model)
    assert (await call).choices[0].message is not None
