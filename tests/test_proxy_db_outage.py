"""The proxy's credential check while Postgres is away (a restart): a token it knew keeps working
from its cache, an unknown one is held and then answered Unavailable (HTTP 503, which harnesses
retry), never an internal error that loses the call (real Postgres, then a port nothing serves)."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gyre.db.engine import make_engine, make_sessionmaker
from gyre.devstack.embedded import free_port
from gyre.errors import Unavailable
from gyre.settings import KernelSettings
from gyre_app.migrations import upgrade
from services.proxy import repo
from services.proxy.auth import TokenBook, Unauthenticated, token_digest
from services.proxy.http_app import _status as status_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_known_tokens_pass_and_unknown_ones_wait_then_get_503_while_postgres_is_away(
    kernel: KernelSettings,
) -> None:
    assert kernel.database_url
    await asyncio.to_thread(upgrade, "proxy", kernel.database_url)
    engine = make_engine(kernel.database_url)
    gone = make_engine(f"postgresql+asyncpg://postgres@127.0.0.1:{free_port()}/postgres")
    try:
        sessions = make_sessionmaker(engine)
        known, execution_id = f"known-{uuid.uuid4().hex}", str(uuid.uuid4())
        async with sessions() as session, session.begin():
            await repo.upsert_token(
                session,
                token_sha256=token_digest(known),
                execution_id=execution_id,
                task_id=str(uuid.uuid4()),
                expires_at=datetime.now(UTC) + timedelta(hours=1),
            )
        book = TokenBook(sessions, cache_s=0.0, hold_s=0.5)  # every check goes to Postgres
        assert await book.execution_of(known) == execution_id
        with pytest.raises(Unauthenticated):
            await book.execution_of("never-registered")

        book.sessions = make_sessionmaker(gone)  # Postgres away
        assert await book.execution_of(known) == execution_id
        with pytest.raises(Unavailable) as held:
            await book.execution_of(f"new-{uuid.uuid4().hex}")
        assert status_for(held.value) == 503
        assert "SELECT" not in str(held.value)
    finally:
        await engine.dispose()
        await gone.dispose()
