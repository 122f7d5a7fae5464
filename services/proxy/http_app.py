"""The harness-facing HTTP server: OpenAI Chat Completions and Anthropic Messages (shell: aiohttp).

Each handler authenticates the execution token, parses the body into a `ChatRequest`, starts a
`CallRun` and writes it back in the dialect asked for, streamed (SSE) or whole. Every failure is
answered in the dialect's own error shape; nothing a harness sends can stop the server. The body
is read, decoded, parsed and size-checked at most `renders_per_execution` of one execution at a
time (`Calls.cpu_slot`), the CPU work in a render worker (`Calls.off_loop`); anything that goes
wrong there is the harness's input: a 4xx naming the field, never a 5xx. A failure of the
proxy's own (5xx: no engine, an engine lost, the database away, a bug past the input) is
counted for the execution before the harness hears of it (`failed_calls`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry.trace import SpanKind

from gyre.errors import GyreError, InvalidArgument, NotFound, Unavailable
from gyre.outages import translate
from gyre.tracing import continued_from
from services.proxy import anthropic_api, openai_api
from services.proxy.auth import Grant, TokenBook, Unauthenticated, bearer_token
from services.proxy.call_keys import ReplayedRun
from services.proxy.calls import CallRun, Calls
from services.proxy.chat import ChatRequest
from services.proxy.failed_calls import FailedCalls
from services.proxy.render import quoted
from services.proxy.request_body import decode_body
from services.proxy.request_size import SizeBound, body_limit, check_size

log = structlog.get_logger(__name__)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CALLS_KEY = web.AppKey("calls", Calls)
TOKENS_KEY = web.AppKey("tokens", TokenBook)
FAILED_CALLS_KEY = web.AppKey("failed_calls", FailedCalls)
MAX_BODY_KEY = web.AppKey("max_body_bytes", int)
EXECUTION_KEY = web.RequestKey("execution_id", str)
"""The execution a request authenticated as: its failures (5xx) are counted for it."""
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Connection": "keep-alive"}


class TooLarge(GyreError):
    """The body is over the size limit (HTTP 413)."""


def _is_anthropic(request: web.Request) -> bool:
    return request.path.startswith("/v1/messages")


def _status(exc: Exception) -> int:
    if isinstance(exc, Unauthenticated):
        return 401
    if isinstance(exc, InvalidArgument):
        return 400
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, TooLarge):
        return 413
    if isinstance(exc, Unavailable):
        return 503
    return 500


def error_response(request: web.Request, exc: Exception) -> web.Response:
    status = _status(exc)
    message = exc.message if isinstance(exc, GyreError) else "internal error in the proxy"
    if _is_anthropic(request):
        body = anthropic_api.error(status, message)
    else:
        body = openai_api.error(
            status, message, param=exc.field if isinstance(exc, InvalidArgument) else None
        )
    return web.json_response(body, status=status)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GyreError as exc:
        log.info("request_refused", path=request.path, status=_status(exc), error=exc.message)
        await _count_failure(request, exc)
        return error_response(request, exc)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(request, TooLarge(f"request body is over the limit: {exc.text}"))
    except web.HTTPNotFound:
        return error_response(request, NotFound(f"no such endpoint: {request.method} {request.path}"))
    except web.HTTPMethodNotAllowed:
        return error_response(request, NotFound(f"{request.method} is not served on {request.path}"))
    except web.HTTPException:
        raise
    except Exception as exc:  # logged with its traceback; the harness sees no internals
        error = translate(exc, where=request.path)
        await _count_failure(request, error)
        return error_response(request, error)


async def _count_failure(request: web.Request, exc: GyreError) -> None:
    """A failure of the proxy's own (5xx) on an authenticated request counts for its execution."""
    execution_id = request.get(EXECUTION_KEY)
    if execution_id and _status(exc) >= 500:
        await request.app[FAILED_CALLS_KEY].count(execution_id, exc.message)


async def _authenticate(request: web.Request) -> Grant:
    token = bearer_token(request.headers.get("Authorization", ""), request.headers.get("x-api-key", ""))
    grant = await request.app[TOKENS_KEY].grant_of(token)
    request[EXECUTION_KEY] = grant.execution_id
    return grant


async def _read_chat(
    request: web.Request, execution_id: str, parse: Callable[[Any], ChatRequest]
) -> ChatRequest:
    """The body as a size-checked `ChatRequest`, decoded and parsed in a render worker. The body
    is read under the execution's CPU slot too: its other connections wait unread."""
    calls = request.app[CALLS_KEY]
    bound = calls.size_bound
    async with calls.cpu_slot(execution_id):
        try:
            raw = await _read_raw(request, limit=body_limit(bound, ceiling=request.app[MAX_BODY_KEY]))
        except (OSError, aiohttp.ClientError) as exc:  # the harness hung up mid-body: its doing
            raise InvalidArgument("body", f"was cut short: {type(exc).__name__}") from exc
        return await calls.off_loop(execution_id, _parse_chat, raw, parse, bound)


async def _read_raw(request: web.Request, *, limit: int) -> bytes:
    """The body's bytes, refused as soon as they are known to be over `limit`."""

    def too_large(size: str) -> TooLarge:
        return TooLarge(
            f"request body is over the limit: {size} bytes, and the most this model's context window "
            f"can need is {limit} (the proxy's own ceiling is {request.app[MAX_BODY_KEY]})"
        )

    if request.content_length is not None and request.content_length > limit:
        raise too_large(str(request.content_length))
    chunks, size = [], 0
    async for chunk in request.content.iter_chunked(256 * 1024):
        size += len(chunk)
        if size > limit:
            raise too_large(f"more than {size}")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_chat(raw: bytes, parse: Callable[[Any], ChatRequest], bound: SizeBound) -> ChatRequest:
    try:
        chat = parse(decode_body(raw))
        check_size(chat, bound)
    except GyreError:
        raise
    except Exception as exc:  # whatever the parser missed is still the harness's input, never a 5xx
        log.warning("request_unreadable", error=type(exc).__name__, exc_info=True)
        raise InvalidArgument(
            "body", f"could not be read as a request: {type(exc).__name__}: {quoted(exc)}"
        ) from exc
    return chat


async def _start(
    request: web.Request, parse: Callable[[Any], ChatRequest]
) -> tuple[ChatRequest, CallRun | ReplayedRun]:
    grant = await _authenticate(request)
    execution_id = grant.execution_id
    chat = await _read_chat(request, execution_id, parse)
    run = await request.app[CALLS_KEY].start(
        execution_id=execution_id,
        request=chat,
        headers=request.headers,
        min_policy_version=grant.min_policy_version,
    )
    structlog.contextvars.bind_contextvars(execution_id=execution_id, call_id=run.call_id)
    return chat, run


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body_holder: dict[str, Any] = {}

    def parse(body: Any) -> ChatRequest:
        body_holder.update(body if isinstance(body, dict) else {})
        return openai_api.parse_request(body)

    chat, run = await _start(request, parse)
    completion_id = f"chatcmpl-{run.call_id.replace('-', '')}"
    created = run.created_s
    if not chat.stream:
        outcome = await run.run_to_end()
        body = openai_api.completion(
            completion_id=completion_id, model=chat.model, created_s=created, outcome=outcome
        )
        return await _whole(request, run, body)
    options = body_holder.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    response = web.StreamResponse(headers=SSE_HEADERS)

    def data(obj: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    def piece(delta: dict[str, Any]) -> bytes:
        return data(
            openai_api.chunk(completion_id=completion_id, model=chat.model, created_s=created, delta=delta)
        )

    async def write_all() -> None:
        await response.prepare(request)
        await response.write(piece({"role": "assistant", "content": ""}))
        async for text in run.text_deltas():
            await response.write(piece({"content": text}))
        assert run.outcome is not None
        for obj in openai_api.final_chunks(
            completion_id=completion_id,
            model=chat.model,
            created_s=created,
            outcome=run.outcome,
            include_usage=include_usage,
        ):
            await response.write(data(obj))
        await response.write(b"data: [DONE]\n\n")

    async def write_error(exc: GyreError) -> None:
        await response.write(data(openai_api.error(_status(exc), exc.message)))

    return await _stream(request, run, response, write_all, write_error)


async def messages(request: web.Request) -> web.StreamResponse:
    chat, run = await _start(request, anthropic_api.parse_request)
    message_id = f"msg_{run.call_id.replace('-', '')}"
    if not chat.stream:
        outcome = await run.run_to_end()
        return await _whole(
            request, run, anthropic_api.message(message_id=message_id, model=chat.model, outcome=outcome)
        )
    response = web.StreamResponse(headers=SSE_HEADERS)

    async def write_all() -> None:
        await response.prepare(request)
        await response.write(
            anthropic_api.message_start(
                message_id=message_id, model=chat.model, prompt_tokens=run.num_prompt_tokens
            )
        )
        text_open = False
        async for text in with_pings(run.text_deltas(), every_s=PING_EVERY_S):
            if text is None:
                await response.write(anthropic_api.PING)
                continue
            if not text_open:
                await response.write(anthropic_api.text_block_start(0))
                text_open = True
            await response.write(anthropic_api.text_delta(0, text))
        assert run.outcome is not None
        index = 0
        if text_open or not run.outcome.tool_calls:
            if not text_open:
                await response.write(anthropic_api.text_block_start(0))
            await response.write(anthropic_api.block_stop(0))
            index = 1
        for i, call in enumerate(run.outcome.tool_calls):
            await response.write(anthropic_api.tool_use_events(index + i, call))
        await response.write(anthropic_api.message_end(run.outcome))

    async def write_error(exc: GyreError) -> None:
        await response.write(anthropic_api.sse("error", anthropic_api.error(_status(exc), exc.message)))

    return await _stream(request, run, response, write_all, write_error)


PING_EVERY_S = 15.0


async def with_pings(deltas: AsyncIterator[str], *, every_s: float) -> AsyncIterator[str | None]:
    """The deltas, with a None after every `every_s` seconds none came (the stream pings then).

    Example: deltas "a" at 1 s and "b" at 25 s, every_s=10 -> "a", None, None, "b"
    """

    async def next_delta() -> tuple[bool, str]:
        try:
            return True, await anext(deltas)
        except StopAsyncIteration:
            return False, ""

    ahead: asyncio.Task[tuple[bool, str]] | None = None
    try:
        while True:
            ahead = ahead or asyncio.ensure_future(next_delta())
            done, _ = await asyncio.wait({ahead}, timeout=every_s)
            if not done:
                yield None
                continue
            more, text = ahead.result()
            ahead = None
            if not more:
                return
            yield text
    finally:
        if ahead is not None:
            ahead.cancel()


async def _whole(
    request: web.Request, run: CallRun | ReplayedRun, body: dict[str, Any]
) -> web.StreamResponse:
    """Send a whole (not streamed) answer; once it is out, the call counts as delivered."""
    response = web.json_response(body)
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:  # the harness hung up: the answer stays a retry's to take
        log.info("harness_disconnected", call_id=run.call_id)
        return response
    request.app[CALLS_KEY].delivered(run)
    return response


async def _stream(
    request: web.Request,
    run: CallRun | ReplayedRun,
    response: web.StreamResponse,
    write_all: Callable[[], Awaitable[None]],
    write_error: Callable[[GyreError], Awaitable[None]],
) -> web.StreamResponse:
    """Write a stream; a harness that hangs up cancels the call, an engine failure ends it in-band."""
    try:
        await write_all()
    except (ConnectionResetError, ConnectionError):
        run.cancel()
        log.info("harness_disconnected", call_id=run.call_id)
        return response
    except GyreError as exc:
        if not response.prepared:
            raise
        log.warning("stream_failed", call_id=run.call_id, error=exc.message)
        await _count_failure(request, exc)
        await write_error(exc)
        await response.write_eof()
        return response
    await response.write_eof()
    request.app[CALLS_KEY].delivered(run)
    return response


async def count_tokens(request: web.Request) -> web.Response:
    execution_id = (await _authenticate(request)).execution_id

    def parse(body: Any) -> ChatRequest:
        return anthropic_api.parse_request({"max_tokens": 1, **body} if isinstance(body, dict) else body)

    chat = await _read_chat(request, execution_id, parse)
    prompt = await request.app[CALLS_KEY].render(execution_id, chat)
    return web.json_response({"input_tokens": len(prompt.ids)})


async def list_models(request: web.Request) -> web.Response:
    await _authenticate(request)
    return web.json_response(openai_api.models([request.app[CALLS_KEY].model.name], created_s=0))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "serving"})


@web.middleware
async def trace_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Continue the harness's trace (its `traceparent` header), or start one per request."""
    with continued_from(request.headers, f"{request.method} {request.path}", kind=SpanKind.SERVER):
        return await handler(request)


def build_app(
    *,
    calls: Calls,
    tokens: TokenBook,
    failed_calls: FailedCalls,
    max_body_bytes: int,
    pin: Middleware | None = None,
) -> web.Application:
    """`pin`: with several proxy processes, the middleware that sends a call to the process
    serving its execution (`peers.pin_middleware`)."""
    middlewares: list[Middleware] = [trace_middleware, errors_middleware, *([pin] if pin else [])]
    app = web.Application(middlewares=middlewares, client_max_size=max_body_bytes)
    app[CALLS_KEY] = calls
    app[TOKENS_KEY] = tokens
    app[FAILED_CALLS_KEY] = failed_calls
    app[MAX_BODY_KEY] = max_body_bytes
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/v1/messages/count_tokens", count_tokens)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    return app
