"""An output holding NUL (the tiny random model emits byte 0) must not cost the call records."""

from __future__ import annotations

import asyncio

from gyre.db.engine import make_engine, make_sessionmaker
from gyre.settings import KernelSettings
from gyre_app.migrations import upgrade
from services.proxy import repo
from services.proxy.render import ReusableOutput


async def test_outputs_with_nul_are_skipped_and_the_rest_are_kept(kernel: KernelSettings) -> None:
    assert kernel.database_url is not None
    await asyncio.to_thread(upgrade, "proxy", kernel.database_url)
    engine = make_engine(kernel.database_url)
    sessions = make_sessionmaker(engine)
    kept = ReusableOutput(segment="hello", gen_prefix="", ids=(7, 8))
    nul = ReusableOutput(segment="he\x00llo", gen_prefix="", ids=(7, 0, 8))
    try:
        async with sessions() as session, session.begin():
            await repo.save_outputs(session, [("exec-nul", nul), ("exec-nul", kept)])
            await repo.save_outputs(session, [("exec-nul", nul)])  # nothing left to insert: no error
        async with sessions() as session:
            assert await repo.load_outputs(session, "exec-nul") == [kept]
    finally:
        await engine.dispose()
