"""Alembic migrations for one service's own Postgres schema (shell).

Each service keeps its migrations in its own folder (`env.py` calls `alembic_env.run`) and
passes that folder here; its version table lives in its own schema and no service touches
another's. The kernel never looks for services itself: the application package lists them.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config

from gyre.db.engine import async_url

_ALEMBIC_LOCK = threading.Lock()


def alembic_config(schema: str, database_url: str, *, script_location: Path) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location))
    cfg.attributes["database_url"] = async_url(database_url)
    cfg.attributes["schema"] = schema
    return cfg


def upgrade(schema: str, database_url: str, *, script_location: Path, revision: str = "head") -> None:
    """Bring one schema to `revision`. Blocking: call via asyncio.to_thread in async code.

    Alembic keeps its migration context in module globals, so runs in one process take turns;
    runs in several processes are serialised by an advisory lock in `alembic_env`.
    """
    if not (script_location / "env.py").is_file():
        raise FileNotFoundError(f"no Alembic env.py in {script_location} (schema {schema!r})")
    with _ALEMBIC_LOCK:
        command.upgrade(alembic_config(schema, database_url, script_location=script_location), revision)
