"""Async SQLAlchemy engines for asyncpg (shell)."""

from __future__ import annotations

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker, create_async_engine


def async_url(url: str) -> str:
    """Accept plain `postgresql://` URLs too; Gyre always talks asyncpg.

    Example:
        async_url("postgresql://postgres@127.0.0.1:5432/test")
        -> "postgresql+asyncpg://postgres@127.0.0.1:5432/test"
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+asyncpg")
    return parsed.render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """The same server as a plain `postgresql://` URL, for asyncpg.connect and libpq tools."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def with_database(url: str, name: str) -> str:
    """The same server and credentials, another database."""
    return make_url(url).set(database=name).render_as_string(hide_password=False)


def make_engine(url: str, *, pool_size: int = 5) -> AsyncEngine:
    return create_async_engine(
        async_url(url), pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=True
    )


def make_sessionmaker(engine: AsyncEngine) -> async_sessionmaker:  # type: ignore[type-arg]
    return async_sessionmaker(engine, expire_on_commit=False)
