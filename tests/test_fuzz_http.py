"""The proxy's HTTP APIs fuzzed over the wire: hypothesis-generated requests to a running proxy.

The proxy (in-process, its own event loop on a thread, real NATS and Postgres, scripted engines
behind it) gets requests on every endpoint and on made-up paths, with every method, a valid,
revoked, garbage or missing credential, and bodies that are valid chat requests with one field
broken (wrong type, negative, huge, odd unicode, NUL), arbitrary JSON, JSON nested too deep,
JSON cut short, or bytes that are not JSON at all. For every request:
- the status is one the API documents (200, 400, 401, 404, 405, 413, 503), never 500;
- an error comes back in the dialect's own JSON error shape, without SQL or a traceback;
- a streamed answer ends with its terminator, or with an in-band error event;
and the proxy answers its health endpoint afterwards. Bounded and derandomized (EXAMPLES).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gyre.settings import KernelSettings
from tests.proxy_support import Rig, start_rig, write_tokenizer
from tests.wire_fuzz import ODD_STRINGS, budget, leaks_internals

EXAMPLES = 100
STATUSES = {200, 400, 401, 404, 405, 413, 503}


@dataclass(slots=True)
class Served:
    rig: Rig
    host: str
    port: int
    token: str
    revoked: str


@pytest.fixture(scope="module")
def served(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(120)

    rig: Rig = run(start_rig(kernel, write_tokenizer(tmp_path_factory.mktemp("http-fuzz") / "tok")))
    token, _ = run(rig.register_execution())
    revoked, execution_id = run(rig.register_execution())
    from gyre.proxy.v1 import proxy_pb2

    async def revoke() -> None:
        request = proxy_pb2.RevokeExecutionTokenRequest(request_id="fz-rv", execution_id=execution_id)
        await rig.stub.RevokeExecutionToken(request)

    run(revoke())
    url = urlsplit(rig.http_url)
    try:
        yield Served(rig=rig, host=url.hostname or "", port=url.port or 0, token=token, revoked=revoked)
    finally:
        run(rig.close())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.sampled_from(ODD_STRINGS[:-1])
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=10,
)
BAD_VALUES = st.one_of(
    JSON, st.integers(-(2**63), 2**63), st.sampled_from([-1, 0, 10**12, 1e308, "", "x" * 200_000, [], {}])
)


def _valid(path: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": "Fix the failing test."}]
    if path.startswith("/v1/messages"):
        return {"model": "tiny", "max_tokens": 8, "messages": messages, "stream": True}
    return {"model": "tiny", "max_tokens": 8, "messages": messages, "stream": True}


@st.composite
def bodies(draw: st.DrawFn, path: str) -> bytes:
    kind = draw(st.sampled_from(["broken-field", "broken-message", "json", "deep", "cut", "bytes", "valid"]))
    body = _valid(path)
    if kind == "broken-field":
        body[draw(st.sampled_from([*body, "temperature", "top_p", "n", "stop", "tools", "system"]))] = draw(
            BAD_VALUES
        )
    elif kind == "broken-message":
        body["messages"][0][draw(st.sampled_from(["role", "content", "tool_calls", "name"]))] = draw(
            BAD_VALUES
        )
    elif kind == "json":
        return json.dumps(draw(JSON)).encode()
    elif kind == "deep":
        depth = draw(st.integers(60, 5000))
        return b"[" * depth + b"]" * depth
    elif kind == "bytes":
        return draw(st.binary(max_size=64))
    data = json.dumps(body).encode()
    if kind == "cut":
        return data[: draw(st.integers(0, len(data) - 1))]
    return data


ENDPOINTS = [
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/messages"),
    ("POST", "/v1/messages/count_tokens"),
]
ODD = [("GET", "/v1/models"), ("GET", "/health"), ("PUT", "/v1/messages"), ("GET", "/v1/chat/completions")]
ODD += [("POST", p) for p in ("/", "/v1", "/v1/chat", "/%00", "/v1/models/../health")]


@st.composite
def http_requests(draw: st.DrawFn) -> tuple[str, str, str, bytes]:
    """Mostly the three POST endpoints with a valid credential (so that bodies are what is judged)."""
    method, path = draw(st.sampled_from(ENDPOINTS * 6 + ODD))
    credential = draw(st.sampled_from(["valid"] * 6 + ["revoked", "garbage", "none"]))
    return method, path, credential, draw(bodies(path))


def _send(served: Served, method: str, path: str, credential: str, body: bytes) -> tuple[int, str, bytes]:
    headers = {"Content-Type": "application/json"}
    token = {"valid": served.token, "revoked": served.revoked, "garbage": "gyre-" + "z" * 40}.get(credential)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection(served.host, served.port, timeout=30)
    try:
        conn.request(method, path, body=body if method in ("POST", "PUT") else None, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("Content-Type") or "", resp.read()
    finally:
        conn.close()


def test_every_endpoint_answers_fuzzed_requests_clearly_and_keeps_serving(served: Served) -> None:
    seen: set[int] = set()

    @budget(EXAMPLES)
    @given(request=http_requests())
    def check(request: tuple[str, str, str, bytes]) -> None:
        method, path, credential, body = request
        status, content_type, answer = _send(served, method, path, credential, body)
        seen.add(status)
        text = answer.decode(errors="replace")
        where = f"{method} {path} ({credential}, {body[:80]!r}) -> {status}: {text[:300]!r}"
        assert status in STATUSES, where
        assert not leaks_internals(text), where
        if status >= 400:
            error = json.loads(answer)
            assert isinstance(error, dict) and "error" in error, where
            detail = error["error"]
            assert isinstance(detail, dict) and detail.get("message"), where
        elif content_type.startswith("text/event-stream"):
            assert text.rstrip().endswith(("data: [DONE]", '"message_stop"}')) or '"error"' in text, where

    check()
    assert {200, 400, 401, 404} <= seen, seen  # the fuzzing reached answers as well as each refusal
    status, _, _ = _send(served, "GET", "/health", "none", b"")
    assert status == 200


def test_the_body_limit_is_named_in_the_refusal(served: Served) -> None:
    limit = served.rig.settings.max_body_bytes
    status, _, answer = _send(served, "POST", "/v1/chat/completions", "valid", b"x" * (limit + 1))
    assert status == 413
    assert str(limit) in json.loads(answer)["error"]["message"]


def test_a_prompt_bigger_than_the_context_window_is_refused_naming_the_limit(served: Served) -> None:
    body = _valid("/v1/chat/completions")
    body["messages"][0]["content"] = "word " * 40_000
    status, _, answer = _send(served, "POST", "/v1/chat/completions", "valid", json.dumps(body).encode())
    assert status == 400
    assert "context window" in json.loads(answer)["error"]["message"]
