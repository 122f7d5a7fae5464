"""The proxy's HTTP APIs through the official openai and anthropic SDKs, with scripted engines:
protocol, auth, bad input, TITO recording with delta prompts, routing and live migration."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio
from proxy_support import Rig, prompt_of, start_rig, write_tokenizer

from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")
TOOL_CALL = '<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call>'
BASH_TOOL = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run a shell command",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
    },
}


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, model_dir: Path) -> AsyncIterator[Rig]:
    rig = await start_rig(kernel, model_dir, num_engines=2)
    yield rig
    await rig.close()


def oai(rig: Rig, token: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{rig.http_url}/v1", api_key=token, max_retries=0)


def claude(rig: Rig, token: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=rig.http_url, api_key=token, max_retries=0)


async def test_openai_sdk_chat_with_a_tool_loop_is_recorded_token_in_token_out(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    client = oai(rig, token)
    rig.scripter.replies = [f"Let me look.{TOOL_CALL}", "All good."]
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are a helpful coding assistant."},
        {"role": "user", "content": "Fix the failing test."},
    ]
    first = await client.chat.completions.create(model="tiny", messages=messages, tools=[BASH_TOOL])  # type: ignore[arg-type]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me look."
    call = choice.message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "test.py"},
    ]
    stream = await client.chat.completions.create(
        model="tiny",
        messages=messages,  # type: ignore[arg-type]
        tools=[BASH_TOOL],  # type: ignore[list-item]
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    assert "".join(texts) == "All good." and finish == "stop"
    assert usage is not None and usage.completion_tokens > 0

    records = await rig.records(execution_id, at_least=2)
    assert len(records) == 2
    one, two = records
    assert one.HasField("full_prompt") and two.HasField("prompt_delta")
    assert two.prompt_delta.parent_call_id == one.call_id
    # The second prompt holds the first call's output ids verbatim, right after its prompt.
    prompt_two = prompt_of(two, {one.call_id: one})
    shared = [*one.full_prompt.prompt_ids, *one.output_ids]
    assert prompt_two[: len(shared)] == shared
    assert two.prompt_delta.num_shared_tokens == len(shared)
    assert one.agent_role == proxy_pb2.AGENT_ROLE_MAIN and one.agent_id == "main"
    assert one.finish_reason == proxy_pb2.CALL_FINISH_REASON_STOP
    assert len(one.output_logprobs) == len(one.output_ids)
    # And it is the exact prompt the engine was given.
    engine_prompts = [p for _, e in rig.engines for p in e.prompts]
    assert prompt_two in engine_prompts


async def test_output_ids_are_reused_where_retokenising_would_differ_even_across_a_proxy_restart(
    rig: Rig,
) -> None:
    """The engine sampled 'Done' as single characters; the second prompt keeps those ids, also
    when the proxy restarted in between (the reusable outputs are kept in Postgres)."""
    token, execution_id = await rig.register_execution()
    tok = rig.scripter.tokenizer
    odd = [tok.convert_tokens_to_ids(c) for c in ["D", "o", "n", "e"]] + [
        tok.convert_tokens_to_ids("<|im_end|>")
    ]
    assert tok.encode("Done", add_special_tokens=False) != odd[:-1]  # BPE would merge them
    calls = {"n": 0}

    def script(prompt_ids: object) -> list[int]:
        calls["n"] += 1
        return odd if calls["n"] == 1 else rig.scripter(prompt_ids)  # type: ignore[arg-type]

    for _, engine in rig.engines:
        engine.script = script
    try:
        client = oai(rig, token)
        messages = [{"role": "user", "content": "hi"}]
        first = await client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
        assert first.choices[0].message.content == "Done"
        await rig.records(execution_id, at_least=1)  # written with its reusable output
        await rig.restart_proxy()
        client = oai(rig, token)
        messages += [{"role": "assistant", "content": "Done"}, {"role": "user", "content": "again"}]
        await client.chat.completions.create(model="tiny", messages=messages)  # type: ignore[arg-type]
    finally:
        for _, engine in rig.engines:
            engine.script = rig.scripter
    one, two = await rig.records(execution_id, at_least=2)
    assert list(one.output_ids) == odd
    prompt_two = prompt_of(two, {one.call_id: one})
    n = len(one.full_prompt.prompt_ids)
    assert prompt_two[n : n + len(odd)] == odd


async def test_anthropic_sdk_messages_stream_and_tool_use(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    client = claude(rig, token)
    rig.scripter.replies = [TOOL_CALL, "Fixed it."]
    tools = [
        {
            "name": "bash",
            "description": "run",
            "input_schema": {"type": "object"},
            "cache_control": {"type": "ephemeral"},
        }
    ]
    first = await client.messages.create(
        model="claude-test",
        max_tokens=256,
        system=[
            {
                "type": "text",
                "text": "You are a helpful coding assistant.",
                "cache_control": {"type": "ephemeral"},
            }
        ],
        messages=[
            {
                "role": "user",
                "content": [{"type": "text", "text": "Fix it", "cache_control": {"type": "ephemeral"}}],
            }
        ],
        tools=tools,  # type: ignore[arg-type]
        metadata={"user_id": "u1"},
        extra_body={"context_management": {"edits": []}, "thinking": {"type": "disabled"}},
    )
    assert first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "ls -la"}
    history = [
        {"role": "user", "content": "Fix it"},
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]},
    ]
    events = []
    async with client.messages.stream(
        model="claude-test",
        max_tokens=256,
        messages=history,
        tools=tools,  # type: ignore[arg-type]
    ) as stream:
        async for event in stream:
            events.append(event.type)
        final = await stream.get_final_message()
    assert final.content[0].type == "text" and final.content[0].text == "Fixed it."  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "content_block_stop" in events and "message_delta" in events
    one, two = await rig.records(execution_id, at_least=2)
    assert two.prompt_delta.parent_call_id == one.call_id


async def test_agent_headers_override_detection_and_claude_code_sub_agents_are_detected(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    client = claude(rig, token)
    await client.messages.create(
        model="m",
        max_tokens=16,
        messages=[{"role": "user", "content": "go"}],
        extra_headers={"X-Gyre-Agent-Role": "sub", "X-Gyre-Agent-Id": "worker-2"},
    )
    await client.messages.create(
        model="m",
        max_tokens=16,
        system="You are an agent for Claude Code, Anthropic's official CLI for Claude.",
        messages=[{"role": "user", "content": "Search the repo for TODOs"}],
    )
    await client.messages.create(
        model="m",
        max_tokens=16,
        system="You are Claude Code, Anthropic's official CLI for Claude.",
        messages=[
            {
                "role": "user",
                "content": "Your task is to create a detailed summary of the conversation so far.",
            }
        ],
    )
    records = await rig.records(execution_id, at_least=3)
    got = [(r.agent_role, r.agent_id) for r in records]
    assert got[0] == (proxy_pb2.AGENT_ROLE_SUB, "worker-2")
    assert got[1][0] == proxy_pb2.AGENT_ROLE_SUB and got[1][1].startswith("sub-")
    assert got[2] == (proxy_pb2.AGENT_ROLE_SUMMARY, "summary")


async def test_missing_unknown_revoked_and_expired_tokens_get_401_in_each_dialect(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    expired, _ = await rig.register_execution(ttl_s=-1)
    with pytest.raises(openai.AuthenticationError, match="unknown credential"):
        await oai(rig, "x" * 40).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    with pytest.raises(anthropic.AuthenticationError, match="expired"):
        await claude(rig, expired).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{rig.http_url}/v1/messages", json={}) as resp:
            assert resp.status == 401
            body = await resp.json()
            assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    await claude(rig, token).messages.create(
        model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
    )
    await rig.stub.RevokeExecutionToken(
        proxy_pb2.RevokeExecutionTokenRequest(request_id=f"rev-{execution_id}", execution_id=execution_id)
    )
    with pytest.raises(anthropic.AuthenticationError, match="revoked"):
        await claude(rig, token).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
        )


def nested(depth: int) -> object:
    value: object = {}
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", {"model": "m", "messages": "hi"}, 400, "messages: must be an array"),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3},
            400,
            "n: only 1",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
            400,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            {
                "model": "m",
                "messages": [
                    {"role": "user", "content": "x"},
                    {"role": "tool", "tool_call_id": "nope", "content": "r"},
                ],
            },
            400,
            "answers no tool call",
        ),
        (
            "/v1/messages",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            400,
            "max_tokens: is required",
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "r"}],
                    }
                ],
            },
            400,
            "t9",
        ),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * 70000}]},
            400,
            "context window",
        ),
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "x" * (33 * 1024 * 1024)}],
            },
            413,
            "over the limit",
        ),
        ("/v1/nope", {}, 404, "no such endpoint"),
        ("/v1/chat/completions", b"[" * 50_000 + b"]" * 50_000, 400, "nested deeper than 64"),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "metadata": nested(100)},
            400,
            "nested deeper than 64",
        ),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]},
            400,
            "over the context window",
        ),
    ],
)
async def test_bad_input_gets_the_apis_own_error_and_the_proxy_keeps_serving(
    rig: Rig, path: str, body: object, status: int, needle: str
) -> None:
    token, _ = await rig.register_execution()
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{rig.http_url}{path}", data=data, headers=headers) as resp:
            assert resp.status == status, await resp.text()
            err = await resp.json()
    message = err["error"]["message"]
    assert needle in message
    if path.startswith("/v1/messages"):
        assert err["type"] == "error"
    else:
        assert "type" in err["error"]
    ok = await oai(rig, token).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert ok.choices[0].finish_reason == "stop"


async def test_models_lists_the_served_model(rig: Rig) -> None:
    token, _ = await rig.register_execution()
    models = await oai(rig, token).models.list()
    assert [m.id for m in models.data] == ["tiny"]


async def test_routing_is_sticky_per_execution_and_least_loaded_across_them(rig: Rig) -> None:
    tokens = [await rig.register_execution() for _ in range(4)]
    for token, _ in tokens:
        for _ in range(2):
            await oai(rig, token).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hi"}]
            )
    engines = {}
    for _, execution_id in tokens:
        records = await rig.records(execution_id, at_least=2)
        assert len({r.engine_id for r in records}) == 1  # sticky
        engines[execution_id] = records[0].engine_id
    routing = await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())
    assert [r.engine_id for r in routing.routes] == ["engine-1", "engine-2"]
    assert all(r.state == proxy_pb2.ROUTE_STATE_ACTIVE for r in routing.routes)


async def test_draining_a_cell_moves_streaming_calls_with_their_kv_and_no_token_is_lost(rig: Rig) -> None:
    text = " ".join(f"w{i}" for i in range(60))
    rig.scripter.default = text
    for _, engine in rig.engines:
        engine.token_interval_s = 0.02
    sessions = [await rig.register_execution() for _ in range(4)]

    async def one(token: str) -> str:
        stream = await oai(rig, token).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "count"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    try:
        tasks = [asyncio.create_task(one(token)) for token, _ in sessions]
        for _ in range(200):  # bounded: 10 s for every stream to be generating
            routes = (await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())).routes
            if sum(r.num_in_flight_calls for r in routes) == len(sessions):
                break
            await asyncio.sleep(0.05)
        cell = max(routes, key=lambda r: r.num_in_flight_calls).cell_id
        drained = await rig.stub.DrainCell(
            proxy_pb2.DrainCellRequest(request_id=f"drain-{uuid.uuid4().hex[:8]}", cell_id=cell, timeout_s=10)
        )
        texts = await asyncio.gather(*tasks)
    finally:
        rig.scripter.default = "Done."
        for _, engine in rig.engines:
            engine.token_interval_s = 0.0
    assert drained.drained and drained.num_calls_migrated >= 1 and drained.kv_transferred_bytes > 0
    assert all(t == text for t in texts)  # no error, no duplicated, no missing token
    records = [r for _, e in sessions for r in await rig.records(e, at_least=1)]
    moved = [r for r in records if r.num_migrations]
    other = "engine-2" if cell == "cell-1" else "engine-1"
    assert len(moved) == drained.num_calls_migrated and all(r.engine_id == other for r in moved)
    routing = {r.cell_id: r.state for r in (await rig.stub.GetRouting(proxy_pb2.GetRoutingRequest())).routes}
    assert routing[cell] == proxy_pb2.ROUTE_STATE_DRAINED
    # A new call goes to the serving cell only; registering the engine again brings the cell back.
    token, execution_id = await rig.register_execution()
    await oai(rig, token).chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert (await rig.records(execution_id, at_least=1))[0].engine_id == "engine-2"
    server, engine = rig.engines[0]
    await rig.stub.RegisterEngine(
        proxy_pb2.RegisterEngineRequest(
            request_id=f"again-{uuid.uuid4().hex[:6]}",
            cell_id=cell,
            engine_id="engine-1",
            address=server.address,
        )
    )


async def test_a_harness_that_hangs_up_cancels_its_call_and_the_partial_output_is_recorded(rig: Rig) -> None:
    token, execution_id = await rig.register_execution()
    rig.scripter.default = " ".join(f"w{i}" for i in range(80))
    for _, engine in rig.engines:
        engine.token_interval_s = 0.02
    body = {"model": "m", "messages": [{"role": "user", "content": "talk"}], "stream": True}
    try:
        async with aiohttp.ClientSession() as http:
            resp = await http.post(
                f"{rig.http_url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
            )
            for _ in range(4):
                await resp.content.readline()
            resp.close()  # hang up mid-stream
        (record,) = await rig.records(execution_id, at_least=1)
    finally:
        rig.scripter.default = "Done."
        for _, engine in rig.engines:
            engine.token_interval_s = 0.0
    assert record.finish_reason == proxy_pb2.CALL_FINISH_REASON_CANCELLED
    assert 0 < len(record.output_ids) < 80
    assert all(record.call_id not in engine.gens for _, engine in rig.engines)  # the engine let it go


async def test_no_serving_engine_is_a_503_in_the_apis_shape(rig: Rig) -> None:
    token, _ = await rig.register_execution()
    for i in (1, 2):
        await rig.stub.DrainCell(
            proxy_pb2.DrainCellRequest(
                request_id=f"off-{i}-{uuid.uuid4().hex[:6]}", cell_id=f"cell-{i}", timeout_s=1
            )
        )
    try:
        with pytest.raises(anthropic.InternalServerError, match="no engine is serving"):
            await claude(rig, token).messages.create(
                model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]
            )
    finally:
        for i, (server, _) in enumerate(rig.engines, start=1):
            await rig.stub.RegisterEngine(
                proxy_pb2.RegisterEngineRequest(
                    request_id=f"on-{i}-{uuid.uuid4().hex[:6]}",
                    cell_id=f"cell-{i}",
                    engine_id=f"engine-{i}",
                    address=server.address,
                )
            )
