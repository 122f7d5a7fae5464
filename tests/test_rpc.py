"""The gRPC bootstrap: every kind of method maps Gyre errors to status codes; health answers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from gyre.rpc import Context, GrpcServer

pytestmark = pytest.mark.asyncio(loop_scope="session")
ERRORS = {
    b"nf": NotFound("no such thing"),
    b"ia": InvalidArgument("x.y", "bad"),
    b"cf": Conflict("taken"),
    b"un": Unavailable("down"),
}


async def unary(request: bytes, context: Context) -> bytes:
    raise ERRORS[request]


async def server_stream(request: bytes, context: Context) -> AsyncIterator[bytes]:
    yield b"first"
    raise ERRORS[request]


async def client_stream(requests: AsyncIterator[bytes], context: Context) -> bytes:
    async for request in requests:
        raise ERRORS[request]
    return b""


async def bidi(requests: AsyncIterator[bytes], context: Context) -> AsyncIterator[bytes]:
    async for request in requests:
        yield b"echo"
        raise ERRORS[request]


def identity(b: bytes) -> bytes:
    return b


async def test_errors_map_to_status_codes_for_all_four_method_kinds() -> None:
    server = GrpcServer(service_names=["test.Errors"])
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, identity, identity),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream, identity, identity),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream, identity, identity),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi, identity, identity),
    }
    server.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Errors", handlers),))
    await server.start()
    expected = {
        b"nf": grpc.StatusCode.NOT_FOUND,
        b"ia": grpc.StatusCode.INVALID_ARGUMENT,
        b"cf": grpc.StatusCode.FAILED_PRECONDITION,
        b"un": grpc.StatusCode.UNAVAILABLE,
    }
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="test.Errors")
            )
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            for key, code in expected.items():
                calls = {
                    "Unary": channel.unary_unary("/test.Errors/Unary", identity, identity)(key),
                    "ServerStream": _drain(
                        channel.unary_stream("/test.Errors/ServerStream", identity, identity)(key)
                    ),
                    "ClientStream": channel.stream_unary("/test.Errors/ClientStream", identity, identity)(
                        iter([key])
                    ),
                    "Bidi": _drain(
                        channel.stream_stream("/test.Errors/Bidi", identity, identity)(iter([key]))
                    ),
                }
                for name, call in calls.items():
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await call
                    assert err.value.code() == code, (name, key)
                    assert err.value.details() == str(ERRORS[key])
    finally:
        await server.stop(grace_s=1)


async def _drain(call: grpc.aio.UnaryStreamCall | grpc.aio.StreamStreamCall) -> list[bytes]:  # type: ignore[type-arg]
    return [item async for item in call]
