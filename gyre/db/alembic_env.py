"""The body of every service's Alembic env.py: online migrations over asyncpg (shell)."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from alembic import context
from sqlalchemy.ext.asyncio import create_async_engine


def _migrate(connection: sa.Connection, schema: str) -> None:
    connection.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    context.configure(connection=connection, version_table_schema=schema, include_schemas=False)
    with context.begin_transaction():
        context.run_migrations()


async def _run(url: str, schema: str) -> None:
    engine = create_async_engine(url, poolclass=sa.pool.NullPool)
    try:
        async with engine.begin() as conn:
            # Two processes migrating at once (gyre up starting every service) take turns.
            await conn.execute(
                sa.text("SELECT pg_advisory_xact_lock(hashtext(:s))"), {"s": f"gyre-migrate-{schema}"}
            )
            await conn.run_sync(_migrate, schema)
    finally:
        await engine.dispose()


def run() -> None:
    if context.is_offline_mode():
        raise SystemExit("Gyre migrations run online only (they need the service's schema)")
    cfg = context.config
    asyncio.run(_run(cfg.attributes["database_url"], cfg.attributes["schema"]))
