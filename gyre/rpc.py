"""gRPC server bootstrap: health, reflection, error mapping, telemetry, graceful shutdown (shell).

Handlers raise `gyre.errors` exceptions; `ErrorInterceptor` turns them into status codes with
the message (and, for bad input, the offending field in the `gyre-error-field` trailer). It
also parses unary requests itself, so a body that is not valid protobuf answers
INVALID_ARGUMENT instead of grpc's generic INTERNAL. Any other exception is translated by
`gyre.outages`: UNAVAILABLE when Postgres or NATS is away, else INTERNAL with an error id,
never the exception's text (which may hold SQL and its parameters).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeAlias

import grpc
import structlog
from google.protobuf import message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from gyre.errors import Conflict, GyreError, InvalidArgument, NotFound, Unavailable
from gyre.logs import bind_ids
from gyre.outages import InternalError, translate
from gyre.rpc_telemetry import TelemetryInterceptor
from gyre.tls import add_port

log = structlog.get_logger(__name__)

STATUS_OF: dict[type[GyreError], grpc.StatusCode] = {
    InvalidArgument: grpc.StatusCode.INVALID_ARGUMENT,
    NotFound: grpc.StatusCode.NOT_FOUND,
    Conflict: grpc.StatusCode.FAILED_PRECONDITION,
    Unavailable: grpc.StatusCode.UNAVAILABLE,
    InternalError: grpc.StatusCode.INTERNAL,
}
# What servicers receive as `context`; grpc's stubs make it generic in request and response.
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
ERROR_FIELD_TRAILER = "gyre-error-field"
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
_MIN_SECONDS, _MAX_SECONDS = -62135596800, 253402300799  # 0001-01-01 .. 9999-12-31, what datetime holds


def status_of(exc: GyreError) -> grpc.StatusCode:
    for cls in type(exc).__mro__:
        if cls in STATUS_OF:
            return STATUS_OF[cls]
    return grpc.StatusCode.UNKNOWN


async def _abort(context: Context, exc: Exception, method: str) -> None:
    if isinstance(exc, grpc.aio.AbortError):  # the handler aborted on its own
        raise exc
    if not isinstance(exc, GyreError):
        exc = translate(exc, where=method)
    if isinstance(exc, InvalidArgument):
        context.set_trailing_metadata(((ERROR_FIELD_TRAILER, exc.field),))
    await context.abort(status_of(exc), exc.message)


def _parse(deserializer: Callable[[bytes], Any] | None, raw: bytes) -> Any:
    if deserializer is None:
        return raw
    try:
        request = deserializer(raw)
    except Exception as exc:
        raise InvalidArgument("request", f"body is not a valid protobuf message: {exc}") from exc
    if isinstance(request, message.Message):
        bind_ids(request)
        bad = invalid_field(request)
        if bad is not None:
            raise InvalidArgument(*bad)
    return request


def invalid_field(msg: message.Message, prefix: str = "") -> tuple[str, str] | None:
    """(path, what is wrong) of the first field of a request no service can store, or None: a
    string holding NUL (Postgres text cannot), a Timestamp no datetime can hold.

    Example: SubmitTasksRequest(tasks=[TaskSpec(deadline=Timestamp(nanos=-1))]) -> ("tasks[0].deadline", ...)
    """
    for field, value in msg.ListFields():
        kind = field.message_type
        items = (
            list(enumerate(value)) if field.is_repeated and not isinstance(value, str) else [(None, value)]
        )
        for i, item in items:
            path = f"{prefix}{field.name}" + ("" if i is None else f"[{i}]")
            if isinstance(item, str) and "\x00" in item:
                return path, "must not contain NUL characters"
            if kind is None or kind.GetOptions().map_entry:
                continue
            if kind.full_name == "google.protobuf.Timestamp":
                if not (_MIN_SECONDS <= item.seconds <= _MAX_SECONDS and 0 <= item.nanos < 1_000_000_000):
                    return path, "is not a valid timestamp (0001-01-01..9999-12-31, nanos 0..999999999)"
            elif (found := invalid_field(item, f"{path}.")) is not None:
                return found
    return None


class ErrorInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Maps GyreError to status codes for every unary and server-streaming method."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        method = str(details.method)
        deserialize, serialize = handler.request_deserializer, handler.response_serializer
        if handler.request_streaming:
            return _wrap_request_streaming(handler, method)

        if handler.unary_unary:
            inner = handler.unary_unary

            async def unary(raw: bytes, context: Context) -> Any:
                try:
                    return await inner(_parse(deserialize, raw), context)
                except Exception as exc:
                    await _abort(context, exc, method)

            return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)

        inner_stream = handler.unary_stream

        async def streaming(raw: bytes, context: Context) -> AsyncIterator[Any]:
            try:
                async for item in inner_stream(_parse(deserialize, raw), context):
                    yield item
            except Exception as exc:
                await _abort(context, exc, method)

        return grpc.unary_stream_rpc_method_handler(streaming, response_serializer=serialize)


def _wrap_request_streaming(handler: Any, method: str) -> Any:
    """Client-streaming methods: each message is parsed here too (a body that is not protobuf
    answers INVALID_ARGUMENT), and errors map as for the others."""
    deserialize, serialize = handler.request_deserializer, handler.response_serializer

    async def parsed(raw_requests: AsyncIterator[bytes]) -> AsyncIterator[Any]:
        async for raw in raw_requests:
            yield _parse(deserialize, raw)

    if handler.stream_unary:
        inner = handler.stream_unary

        async def stream_unary(requests: AsyncIterator[bytes], context: Context) -> Any:
            try:
                return await inner(parsed(requests), context)
            except Exception as exc:
                await _abort(context, exc, method)

        return grpc.stream_unary_rpc_method_handler(stream_unary, response_serializer=serialize)
    inner_stream = handler.stream_stream

    async def stream_stream(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[Any]:
        try:
            async for item in inner_stream(parsed(requests), context):
                yield item
        except Exception as exc:
            await _abort(context, exc, method)

    return grpc.stream_stream_rpc_method_handler(stream_stream, response_serializer=serialize)


class GrpcServer:
    """A grpc.aio server with health checking and reflection for the given gRPC service names."""

    def __init__(self, *, service_names: Iterable[str], host: str = "127.0.0.1", port: int = 0) -> None:
        self.server = grpc.aio.server(
            # Telemetry outside: it times the whole call and sees the status the errors map to.
            interceptors=[TelemetryInterceptor(), ErrorInterceptor()],
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        self.service_names = list(service_names)
        self.health = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = add_port(self.server, f"{host}:{port}")
        if self.port == 0:
            raise OSError(f"could not bind gRPC server to {host}:{port}")
        self.address = f"{host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        """Report NOT_SERVING first so balancers stop routing, then let in-flight calls finish."""
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)


def stop_on_signals(stop: asyncio.Event) -> None:
    """Set `stop` on SIGINT/SIGTERM so a process shuts down gracefully."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
