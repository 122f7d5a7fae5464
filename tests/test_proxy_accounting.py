"""The proxy's record of a call is durable before the harness has the answer, and revoking an
execution's token answers how many calls were recorded for it, and how many the proxy failed
(scripted engines, real NATS and Postgres)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
import sqlalchemy as sa
from proxy_support import Rig, start_rig, write_tokenizer

from bench.scripted_engine import start_scripted_engine
from gyre.db.engine import make_engine
from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, model_dir: Path) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, model_dir, num_engines=1)
    yield rig
    await rig.close()


async def recorded_in_postgres(kernel: KernelSettings, execution_id: str) -> int:
    assert kernel.database_url
    engine = make_engine(kernel.database_url)
    try:
        async with engine.connect() as conn:
            found = await conn.scalar(
                sa.text("SELECT num_calls FROM proxy.recorded_calls WHERE execution_id = :e"),
                {"e": execution_id},
            )
    finally:
        await engine.dispose()
    return int(found or 0)


async def revoke(rig: Rig, execution_id: str, *, cancel: bool) -> proxy_pb2.RevokeExecutionTokenResponse:
    request = proxy_pb2.RevokeExecutionTokenRequest(
        request_id=f"rev-{execution_id}", execution_id=execution_id, cancel_in_flight=cancel
    )
    answer: proxy_pb2.RevokeExecutionTokenResponse = await rig.stub.RevokeExecutionToken(request)
    return answer


async def test_a_streamed_answer_ends_only_after_its_record_is_committed(
    rig: Rig, kernel: KernelSettings
) -> None:
    token, execution_id = await rig.register_execution()
    assert kernel.database_url
    engine = make_engine(kernel.database_url)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    try:
        async with engine.connect() as blocker, aiohttp.ClientSession() as http:
            # Hold the row the record's transaction must write, as a slow database would.
            await blocker.begin()
            await blocker.execute(
                sa.text("INSERT INTO proxy.recorded_calls (execution_id, num_calls) VALUES (:e, 0)"),
                {"e": execution_id},
            )
            resp = await http.post(
                f"{rig.http_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
            )

            async def until_finish() -> None:
                for _ in range(100):  # bounded: up to the chunk that carries the finish reason
                    if '"finish_reason": "stop"' in (await resp.content.readline()).decode():
                        return

            finish = asyncio.create_task(until_finish())
            await asyncio.wait({finish}, timeout=1.5)
            assert not finish.done()  # the engine is done, the record is not: no end for the harness
            await blocker.commit()
            await asyncio.wait_for(finish, timeout=10)
            resp.close()
    finally:
        await engine.dispose()
    assert await recorded_in_postgres(kernel, execution_id) == 1


async def test_revoking_answers_the_calls_recorded_including_one_cut_short(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    client = openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)
    for _ in range(2):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    rig.scripter.default = " ".join(f"w{i}" for i in range(200))
    _, engine = rig.engines[0]
    engine.token_interval_s = 0.02
    try:
        running = asyncio.create_task(
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "talk"}])
        )
        for _ in range(200):  # bounded: 10 s for the third call to be generating
            routes = (await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())).routes
            if sum(r.num_in_flight_calls for r in routes) == 1:
                break
            await asyncio.sleep(0.05)
        answer = await revoke(rig, execution_id, cancel=True)
        await asyncio.gather(running, return_exceptions=True)
    finally:
        rig.scripter.default = "Done."
        engine.token_interval_s = 0.0
    assert (answer.num_calls_cancelled, answer.num_calls_recorded) == (1, 3)
    assert len(await rig.records(execution_id, at_least=3)) == 3
    again = await revoke(rig, execution_id, cancel=True)  # the runner asking again after a restart
    assert again.num_calls_recorded == 3


async def test_a_call_that_starts_after_the_revocation_is_refused_and_not_counted(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    client = openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert (await revoke(rig, execution_id, cancel=False)).num_calls_recorded == 1
    with pytest.raises(openai.AuthenticationError):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}])


async def test_an_execution_that_made_no_call_counts_zero(rig: Rig) -> None:
    _, execution_id = await rig.register_execution()
    answer = await revoke(rig, execution_id, cancel=False)
    assert (answer.num_tokens_revoked, answer.num_calls_recorded) == (1, 0)


async def test_revoking_answers_the_calls_the_proxy_failed_and_not_the_harness_errors(
    kernel: KernelSettings, model_dir: Path
) -> None:
    """5xx answers (no engine serving; an engine lost mid-stream with none to fail over to) count;
    a bad request (400) and a stranger's token (401) do not; the count outlives the proxy process."""
    failing = await start_rig(kernel, model_dir, num_engines=0)
    server = None
    try:
        token, execution_id = await failing.register_execution()
        client = openai.AsyncOpenAI(base_url=f"{failing.http_url}/v1", api_key=token, max_retries=0)
        for _ in range(2):
            with pytest.raises(openai.InternalServerError, match="no engine is serving"):
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        async with aiohttp.ClientSession() as http:
            for auth in (token, "x" * 43):
                bad = await http.post(
                    f"{failing.http_url}/v1/chat/completions",
                    data=b"{",
                    headers={"Authorization": f"Bearer {auth}"},
                )
                assert bad.status in (400, 401)
        failing.scripter.default = " ".join(f"w{i}" for i in range(200))
        server, _ = await start_scripted_engine(
            failing.scripter, engine_id="lost-1", cell_id="lost-1", token_interval_s=0.02
        )
        await failing.stub.RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id="reg-lost-1", cell_id="lost-1", engine_id="lost-1", address=server.address
            )
        )
        stream = await client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "talk"}], stream=True
        )
        with pytest.raises(openai.APIError, match="failed call"):
            async for _ in stream:  # the engine goes away mid-answer: the stream ends in an error
                if server is not None:
                    await server.stop(0)
                    server = None
        await failing.restart_proxy()
        answer = await revoke(failing, execution_id, cancel=False)
        again = await revoke(failing, execution_id, cancel=False)
    finally:
        if server is not None:
            await server.stop(0)
        await failing.close()
    assert answer.num_calls_failed_by_proxy == 3
    assert "failed call" in answer.last_call_failure, answer.last_call_failure
    assert again == answer
