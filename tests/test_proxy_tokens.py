"""Execution tokens stay scoped and expiring: one execution per token, refused once expired even
while a lookup is cached, never stored or logged in clear."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aiohttp
import grpc
import pytest
import pytest_asyncio

from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings
from tests.proxy_support import Rig, start_rig, write_tokenizer

CHAT = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, write_tokenizer(tmp_path_factory.mktemp("tokens") / "tok"), num_engines=1)
    yield rig
    await rig.close()


async def _status(rig: Rig, token: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http:
        async with http.post(
            f"{rig.http_url}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {token}"}
        ) as resp:
            return resp.status, await resp.text()


async def test_a_token_that_expires_while_its_lookup_is_cached_is_refused(rig: Rig) -> None:
    token, _ = await rig.register_execution(ttl_s=3)
    assert (await _status(rig, token))[0] == 200  # now cached (cache_s 5 s, longer than the token lives)
    await asyncio.sleep(3.2)
    status, text = await _status(rig, token)
    assert status == 401 and "expired" in text


async def test_a_token_belongs_to_one_execution_only(rig: Rig) -> None:
    token, _ = await rig.register_execution()
    request = proxy_pb2.RegisterExecutionTokenRequest(request_id=f"steal-{uuid.uuid4().hex[:8]}", token=token)
    request.execution.execution_id = str(uuid.uuid4())
    request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await rig.stub.RegisterExecutionToken(request)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "another execution" in (refused.value.details() or "")


async def test_only_the_digest_of_a_token_is_stored(rig: Rig, kernel: KernelSettings) -> None:
    import asyncpg

    from gyre.db.engine import libpq_url

    token, _ = await rig.register_execution()
    assert kernel.database_url
    conn = await asyncpg.connect(libpq_url(kernel.database_url))
    try:
        rows = await conn.fetch("SELECT * FROM proxy.execution_tokens")
    finally:
        await conn.close()
    assert rows and not any(
        token in str(value) or token.encode() == value for r in rows for value in r.values()
    )
