"""gRPC telemetry: latency per method on servers, trace context through call metadata (shell).

`TelemetryInterceptor` sits outside the error interceptor on every `GrpcServer`: it continues the
caller's trace from the `traceparent` metadata key (a new trace when there is none) and observes
`gyre_rpc_duration_seconds{method, code}`. `channel(address)` is an aio channel whose calls carry
the current trace context in their metadata, so the next server continues the same trace.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
from opentelemetry.trace import SpanKind

from gyre.metrics import RPC_SECONDS
from gyre.tls import aio_channel
from gyre.tracing import continued_from, current_carrier


def _code_name(context: Any) -> str:
    code = context.code() if hasattr(context, "code") else None
    if isinstance(code, grpc.StatusCode):
        return code.name
    return "UNKNOWN"


@contextmanager
def _observed(method: str, context: Any) -> Iterator[None]:
    carrier = {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
    started = time.perf_counter()
    code = "OK"
    try:
        with continued_from(carrier, method, kind=SpanKind.SERVER):
            yield
    except BaseException:
        code = _code_name(context)
        raise
    finally:
        RPC_SECONDS.labels(method=method, code=code).observe(time.perf_counter() - started)


class TelemetryInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        if handler.unary_unary or handler.stream_unary:
            attr = "unary_unary" if handler.unary_unary else "stream_unary"
            inner = getattr(handler, attr)

            async def single(request: Any, context: Any) -> Any:
                with _observed(method, context):
                    return await inner(request, context)

            return handler._replace(**{attr: single})
        attr = "unary_stream" if handler.unary_stream else "stream_stream"
        inner_stream = getattr(handler, attr)

        async def streaming(request: Any, context: Any) -> AsyncIterator[Any]:
            with _observed(method, context):
                async for item in inner_stream(request, context):
                    yield item

        return handler._replace(**{attr: streaming})


def _with_trace(details: Any) -> Any:
    carrier = current_carrier()
    if not carrier:
        return details
    metadata = [*(details.metadata or ()), *carrier.items()]
    return details._replace(metadata=grpc.aio.Metadata(*metadata))


class _TraceUnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc,type-arg]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_trace(details), request)


class _TraceUnaryStream(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc,type-arg]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_trace(details), request)


class _TraceStreamUnary(grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc,type-arg]
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_trace(details), requests)


class _TraceStreamStream(grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc,type-arg]
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_with_trace(details), requests)


CLIENT_INTERCEPTORS = (_TraceUnaryUnary, _TraceUnaryStream, _TraceStreamUnary, _TraceStreamStream)


def channel(address: str, *, options: list[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """An aio channel whose calls carry the caller's trace context (mutual TLS when configured)."""
    return aio_channel(
        address,
        options=options,
        interceptors=[_TraceUnaryUnary(), _TraceUnaryStream(), _TraceStreamUnary(), _TraceStreamStream()],
    )
