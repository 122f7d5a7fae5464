"""The proxy in front of two real torch engines (tiny model, same weights): a greedy streaming
call drained off its cell mid-generation continues on the other engine with its KV cache, and
the harness receives exactly the tokens an undisturbed run produces."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import pytest_asyncio
from proxy_support import Rig, start_rig

from gyre.proxy.v1 import proxy_pb2
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine_rig(
    kernel: KernelSettings, tiny_model: Path
) -> AsyncIterator[tuple[Rig, list[ServiceHost]]]:
    from services.engine.config import EngineSettings
    from services.engine.main import build

    rig = await start_rig(kernel, tiny_model, num_engines=0)
    hosts = []
    for i in (1, 2):
        settings = EngineSettings(
            model_dir=tiny_model,
            engine_id=f"torch-{i}",
            cell_id=f"cell-{i}",
            num_threads=1,
            publish_events=False,
            init_model_if_missing=False,
        )
        host = await build(settings, kernel)
        await host.start()
        hosts.append(host)
        await rig.stub.RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id=f"torch-{i}-{uuid.uuid4().hex[:6]}",
                cell_id=f"cell-{i}",
                engine_id=f"torch-{i}",
                address=host.address,
            )
        )
    yield rig, hosts
    for host in hosts:
        await host.stop(grace_s=1)
    await rig.close()


async def test_a_drained_call_continues_on_another_engine_with_the_same_tokens(
    engine_rig: tuple[Rig, list[ServiceHost]],
) -> None:
    rig, _ = engine_rig
    token, execution_id = await rig.register_execution()
    client = openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)
    messages = [{"role": "user", "content": "Fix the failing test and run the test suite again."}]

    async def run(*, drain: bool) -> str:
        stream = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            stream=True,
            temperature=0,
            max_tokens=160,  # type: ignore[arg-type]
        )
        parts: list[str] = []
        drained = None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
            if drain and drained is None and len(parts) >= 6:
                routing = await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())
                busy = next(r for r in routing.routes if r.num_in_flight_calls)
                drained = asyncio.ensure_future(
                    rig.stub.DrainCell(
                        proxy_pb2.DrainCellRequest(
                            request_id=f"drain-{uuid.uuid4().hex[:8]}", cell_id=busy.cell_id, timeout_s=30
                        )
                    )
                )
        if drained is not None:
            answer = await drained
            assert answer.drained and answer.num_calls_migrated == 1 and answer.kv_transferred_bytes > 0
        return "".join(parts)

    undisturbed = await run(drain=False)
    migrated = await run(drain=True)
    assert migrated == undisturbed
    one, two = await rig.records(execution_id, at_least=2)
    assert two.num_migrations == 1 and one.num_migrations == 0
    assert list(two.output_ids) == list(one.output_ids)
    assert two.engine_id != one.engine_id
