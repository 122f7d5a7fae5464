"""A streamed Anthropic answer pings while the engine is silent (a long prompt's prefill), so a
client that gives up on an idle stream keeps waiting; the answer itself is unchanged."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import pytest
from proxy_support import start_rig, write_tokenizer

from gyre.settings import KernelSettings
from services.proxy import http_app


async def test_a_silent_stretch_yields_a_ping_between_deltas() -> None:
    async def deltas() -> AsyncIterator[str]:
        yield "a"
        await asyncio.sleep(0.3)
        yield "b"

    seen = [d async for d in http_app.with_pings(deltas(), every_s=0.05)]
    assert seen[0] == "a" and seen[-1] == "b"
    assert None in seen and set(seen[1:-1]) == {None}


async def test_no_pings_when_the_deltas_keep_coming() -> None:
    async def deltas() -> AsyncIterator[str]:
        for text in ("a", "b", "c"):
            yield text

    assert [d async for d in http_app.with_pings(deltas(), every_s=60)] == ["a", "b", "c"]


@pytest.mark.asyncio(loop_scope="session")
async def test_the_messages_stream_pings_before_a_slow_first_token(
    kernel: KernelSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_app, "PING_EVERY_S", 0.05)
    rig = await start_rig(kernel, write_tokenizer(tmp_path / "tok"), num_engines=1, token_interval_s=0.3)
    try:
        token, _ = await rig.register_execution()
        body = {
            "model": "m",
            "max_tokens": 8,
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
        headers = {"x-api-key": token, "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{rig.http_url}/v1/messages", json=body, headers=headers) as resp:
                raw = (await resp.read()).decode()
        events = [line.removeprefix("event: ") for line in raw.splitlines() if line.startswith("event: ")]
        assert events[0] == "message_start" and events[1] == "ping", events
        assert events[-1] == "message_stop"
        client = anthropic.AsyncAnthropic(base_url=rig.http_url, api_key=token, max_retries=0)
        async with client.messages.stream(
            model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            assert await stream.get_final_text() == "Done."  # pings are invisible to the SDK
    finally:
        await rig.close()
