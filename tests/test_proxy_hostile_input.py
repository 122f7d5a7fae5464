"""Harness input never makes the proxy answer 5xx, nor count a failure against itself (real proxy,
real NATS and Postgres, a scripted engine behind it).

Each class of input that used to end as the proxy's own error (HTTP 500, counted in
`failed_calls`, so that the harness's exit became `model_unavailable`) ends as a 4xx naming the
field, the execution's failed-call count stays 0, and the proxy keeps serving. Then hypothesis
sends OpenAI and Anthropic bodies, valid, near-valid and hostile (`bench.proxy_bodies`), and none
is answered 5xx.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given

from bench.proxy_bodies import bodies
from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings
from tests.proxy_support import Rig, start_rig, write_tokenizer
from tests.wire_fuzz import budget

EXAMPLES = 60
WINDOW_TOKENS = 16384
MAX_TOKEN_CHARS = 16  # the tiny tokenizer's longest vocabulary entry
MAX_CHARS = WINDOW_TOKENS * MAX_TOKEN_CHARS
CHAT, MESSAGES, COUNT = "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"
USER = [{"role": "user", "content": "Fix the failing test."}]


@dataclass(slots=True)
class Served:
    rig: Rig
    host: str
    port: int
    run: Any


@pytest.fixture(scope="module")
def served(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A proxy on its own event loop thread, so the tests can be plain hypothesis functions."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    model_dir: Path = write_tokenizer(tmp_path_factory.mktemp("hostile") / "tok")
    rig: Rig = run(start_rig(kernel, model_dir, num_engines=1))
    assert rig.proxy.calls.model.max_token_chars == MAX_TOKEN_CHARS
    assert rig.proxy.calls.model.context_window_tokens == WINDOW_TOKENS
    url = urlsplit(rig.http_url)
    try:
        yield Served(rig=rig, host=url.hostname or "", port=url.port or 0, run=run)
    finally:
        run(rig.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def post(served: Served, path: str, token: str, body: bytes) -> tuple[int, str]:
    conn = http.client.HTTPConnection(served.host, served.port, timeout=60)
    try:
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request("POST", path, body=body, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def failed_by_proxy(served: Served, execution_id: str) -> int:
    """The execution's calls the proxy counts as its own failures (answered when revoking it)."""

    async def revoke() -> int:
        request = proxy_pb2.RevokeExecutionTokenRequest(
            request_id=f"rv-{execution_id}", execution_id=execution_id
        )
        answer: proxy_pb2.RevokeExecutionTokenResponse = await served.rig.stub.RevokeExecutionToken(request)
        return answer.num_calls_failed_by_proxy

    count: int = served.run(revoke())
    return count


def openai_body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 4, "messages": USER, **fields}


def anthropic_body(**fields: Any) -> dict[str, Any]:
    return {"model": "tiny", "max_tokens": 4, "messages": USER, **fields}


def tool(**fields: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "bash", "description": "", **fields}}


HUGE = "lorem ipsum " * (MAX_CHARS // 12 + 10)
CLASSES = [
    # out-of-range numbers: a seed past uint64 overflowed the engine request's field
    ("seed-past-uint64", CHAT, openai_body(seed=2**64), "seed"),
    ("seed-negative", CHAT, openai_body(seed=-1), "seed"),
    ("max-tokens-huge", MESSAGES, anthropic_body(max_tokens=10**30), "max_tokens"),
    # lone surrogates: no UTF-8 encoder (tokenizer, call key digest) takes them
    (
        "surrogate-in-content",
        CHAT,
        openai_body(messages=[{"role": "user", "content": "hi \ud800"}]),
        "messages[0].content",
    ),
    ("surrogate-in-system", MESSAGES, anthropic_body(system="be brief \udfff"), "system"),
    ("surrogate-in-tool-name", CHAT, openai_body(tools=[tool(name="b\udc00")]), "tools[0].function.name"),
    (
        "surrogate-in-count-tokens",
        COUNT,
        {"model": "tiny", "messages": [{"role": "user", "content": "\ud83d"}]},
        "messages[0].content",
    ),
    ("surrogate-in-a-key", CHAT, openai_body(metadata={"k\ud800": 1}), "metadata"),
    # parts the early size check skipped: tool descriptions, schemas, names, system text
    (
        "huge-tool-description",
        CHAT,
        openai_body(tools=[tool(description=HUGE)]),
        "tools[0].function.description",
    ),
    (
        "huge-tool-schema",
        MESSAGES,
        anthropic_body(tools=[{"name": "t", "input_schema": {"type": "object", "description": HUGE}}]),
        "tools[0].input_schema",
    ),
    ("huge-tool-name", MESSAGES, anthropic_body(tools=[{"name": HUGE, "input_schema": {}}]), "tools[0].name"),
    ("huge-system", MESSAGES, anthropic_body(system=[{"type": "text", "text": HUGE}]), "system"),
    (
        "huge-count-tokens-tool",
        COUNT,
        {"model": "tiny", "messages": USER, "tools": [{"name": "t", "description": HUGE}]},
        "tools[0].description",
    ),
]


@pytest.mark.parametrize(("path", "body", "field"), [c[1:] for c in CLASSES], ids=[c[0] for c in CLASSES])
def test_each_class_of_hostile_input_is_a_4xx_naming_its_field_and_is_not_the_proxys_failure(
    served: Served, path: str, body: dict[str, Any], field: str
) -> None:
    token, execution_id = served.run(served.rig.register_execution())
    status, text = post(served, path, token, json.dumps(body).encode())
    assert status == 400, text
    error = json.loads(text)
    message = error["error"]["message"]
    assert message.startswith(f"{field}: "), message
    if path == CHAT:
        assert error["error"]["param"] == field
    status, text = post(
        served, path, token, json.dumps(anthropic_body() if path != CHAT else openai_body()).encode()
    )
    assert status == 200, text  # the execution and the proxy keep serving
    assert failed_by_proxy(served, execution_id) == 0


def test_a_body_bigger_than_any_prompt_could_need_is_refused_before_it_is_read_whole(served: Served) -> None:
    token, execution_id = served.run(served.rig.register_execution())
    body = json.dumps(openai_body(metadata={"pad": "x" * (MAX_CHARS * 12 + 2 * 1024 * 1024)})).encode()
    status, text = post(served, CHAT, token, body)
    assert status == 413, text
    assert "the most this model's context window can need is" in json.loads(text)["error"]["message"]
    assert failed_by_proxy(served, execution_id) == 0


def test_fuzzed_openai_and_anthropic_bodies_never_get_a_5xx(served: Served) -> None:
    token, execution_id = served.run(served.rig.register_execution())
    seen: dict[str, set[int]] = {"valid": set(), "near-valid": set(), "hostile": set()}

    @budget(EXAMPLES)
    @given(openai=bodies("openai", max_chars=MAX_CHARS), anthropic=bodies("anthropic", max_chars=MAX_CHARS))
    def check(openai: tuple[str, bytes], anthropic: tuple[str, bytes]) -> None:
        for path, (kind, body) in ((CHAT, openai), (MESSAGES, anthropic)):
            status, text = post(served, path, token, body)
            seen[kind].add(status)
            where = f"{path} {kind} {body[:200]!r} -> {status}: {text[:300]!r}"
            assert status < 500, where
            if status >= 400:
                assert json.loads(text)["error"]["message"], where

    check()
    assert 200 in seen["valid"] and 400 in seen["hostile"], seen  # answers as well as refusals
    assert failed_by_proxy(served, execution_id) == 0
