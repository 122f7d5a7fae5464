"""Where the URLs come from, and migrations that can run again and side by side."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from gyre.db.engine import async_url, make_engine
from gyre.errors import Unavailable
from gyre.settings import (
    KernelSettings,
    resolve_database_url,
    resolve_nats_url,
    resolve_urls,
    stack_state_path,
)
from gyre_app.migrations import migrations_dir, services_with_migrations, upgrade


def test_environment_wins_then_the_local_stack(tmp_path: Path) -> None:
    stack_state_path(tmp_path).write_text(
        json.dumps({"nats_url": "nats://stack", "database_url": "postgresql://stack"})
    )
    from_stack = resolve_urls(KernelSettings(nats_url=None, database_url=None, state_dir=tmp_path))
    assert (from_stack.nats_url, from_stack.database_url) == ("nats://stack", "postgresql://stack")
    mixed = resolve_urls(KernelSettings(nats_url="nats://env", database_url=None, state_dir=tmp_path))
    assert (mixed.nats_url, mixed.database_url) == ("nats://env", "postgresql://stack")


def test_no_urls_and_no_stack_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(Unavailable, match=r"GYRE_NATS_URL and GYRE_DATABASE_URL unset .* run `gyre up`"):
        resolve_urls(KernelSettings(nats_url=None, database_url=None, state_dir=tmp_path))


def test_the_database_alone_resolves_without_a_bus_and_takes_its_password_file(tmp_path: Path) -> None:
    """`gyre migrate` in deploy/'s migrations job is told its database and nothing else."""
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    settings = KernelSettings(
        nats_url=None,
        database_url="postgresql+asyncpg://postgres@db:5432/gyre",
        database_password_file=password,
        state_dir=tmp_path,
    )
    assert resolve_database_url(settings) == "postgresql+asyncpg://postgres:s3cret@db:5432/gyre"
    with pytest.raises(Unavailable, match=r"^GYRE_DATABASE_URL unset .* run `gyre up`"):
        resolve_database_url(KernelSettings(nats_url="nats://x", database_url=None, state_dir=tmp_path))


def test_the_bus_alone_resolves_without_a_database_and_takes_its_password_file(tmp_path: Path) -> None:
    """The engine in deploy/ is told the bus and a password file, no database."""
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    settings = KernelSettings(
        nats_url="nats://gyre@nats:4222", database_url=None, nats_password_file=password, state_dir=tmp_path
    )
    assert resolve_nats_url(settings) == "nats://gyre:s3cret@nats:4222"
    stack_state_path(tmp_path).write_text(json.dumps({"nats_url": "nats://stack"}))
    assert (
        resolve_nats_url(KernelSettings(nats_url=None, database_url=None, state_dir=tmp_path))
        == "nats://stack"
    )


def test_plain_postgres_urls_are_driven_by_asyncpg() -> None:
    assert async_url("postgresql://u@h:1/d") == "postgresql+asyncpg://u@h:1/d"
    assert async_url("postgresql+asyncpg://u@h:1/d") == "postgresql+asyncpg://u@h:1/d"


@pytest.mark.asyncio(loop_scope="session")
async def test_migrations_run_twice_and_concurrently_without_harm(kernel: KernelSettings) -> None:
    assert kernel.database_url is not None
    url = kernel.database_url
    services = services_with_migrations()
    assert services == ["evaluator", "proxy", "runner", "scheduler", "trainer", "trajectory"]
    # Side by side in separate processes, as `gyre up` starts services; then once more in this one.
    code = "import sys; from gyre_app.migrations import upgrade_all; upgrade_all(sys.argv[1])"
    procs = [await asyncio.create_subprocess_exec(sys.executable, "-c", code, url) for _ in range(3)]
    assert [await p.wait() for p in procs] == [0, 0, 0]
    for service in services:
        await asyncio.to_thread(upgrade, service, url)
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            for service in services:
                version = (
                    await conn.execute(sa.text(f"SELECT version_num FROM {service}.alembic_version"))
                ).scalar_one()
                assert version == ScriptDirectory(str(migrations_dir(service))).get_current_head()
                tables = set(
                    (
                        await conn.execute(
                            sa.text(
                                "SELECT table_name FROM information_schema.tables WHERE table_schema = :s"
                            ),
                            {"s": service},
                        )
                    ).scalars()
                )
                assert {"outbox", "processed_messages", "alembic_version"} <= tables
    finally:
        await engine.dispose()
