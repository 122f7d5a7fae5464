"""No error a caller sees carries SQL or internal state: a database error that escapes a handler
is INTERNAL with an error id (the traceback is logged), a lost database is UNAVAILABLE."""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa

from gyre.db.engine import make_engine
from gyre.rpc import Context, GrpcServer
from gyre.settings import KernelSettings

pytestmark = pytest.mark.asyncio(loop_scope="session")


def identity(b: bytes) -> bytes:
    return b


async def call_failing(handler: object) -> grpc.aio.AioRpcError:
    server = GrpcServer(service_names=["test.Db"])
    method = grpc.unary_unary_rpc_method_handler(handler, identity, identity)  # type: ignore[arg-type]
    server.server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Db", {"Run": method}),)
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(server.address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await channel.unary_unary("/test.Db/Run", identity, identity)(b"secret-parameter")
            return err.value
    finally:
        await server.stop(grace_s=1)


async def test_a_failing_statement_answers_internal_without_its_sql(kernel: KernelSettings) -> None:
    assert kernel.database_url
    engine = make_engine(kernel.database_url)

    async def run(request: bytes, context: Context) -> bytes:
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT CAST(:p AS text)::int"), {"p": request.decode()})
        return b""

    try:
        err = await call_failing(run)
    finally:
        await engine.dispose()
    details = err.details() or ""
    assert err.code() == grpc.StatusCode.INTERNAL
    assert "error id" in details
    assert "SELECT" not in details and "secret-parameter" not in details


async def test_an_unreachable_database_answers_unavailable() -> None:
    engine = make_engine("postgresql+asyncpg://nobody@127.0.0.1:1/none")

    async def run(request: bytes, context: Context) -> bytes:
        async with engine.connect() as conn:
            await conn.execute(sa.text("SELECT 1"))
        return b""

    try:
        err = await call_failing(run)
    finally:
        await engine.dispose()
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "nobody" not in (err.details() or "")
