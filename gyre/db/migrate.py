"""Per-service Alembic migrations, each service in its own Postgres schema (shell).

Every service keeps `services/<name>/migrations/` (env.py calls `alembic_env.run`), its
version table lives in its own schema, and no service touches another's schema.
"""

from __future__ import annotations

import threading
from pathlib import Path

from alembic import command
from alembic.config import Config

from gyre.db.engine import async_url

_ALEMBIC_LOCK = threading.Lock()
SERVICES_ROOT = Path(__file__).resolve().parents[2] / "services"


def migrations_dir(service: str) -> Path:
    return SERVICES_ROOT / service / "migrations"


def services_with_migrations() -> list[str]:
    return sorted(p.parent.parent.name for p in SERVICES_ROOT.glob("*/migrations/env.py"))


def alembic_config(service: str, database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir(service)))
    cfg.attributes["database_url"] = async_url(database_url)
    cfg.attributes["schema"] = service
    return cfg


def upgrade(service: str, database_url: str, revision: str = "head") -> None:
    """Bring one service's schema to `revision`. Blocking: call via asyncio.to_thread in async code.

    Alembic keeps its migration context in module globals, so runs in one process take turns;
    runs in several processes are serialised by an advisory lock in `alembic_env`.
    """
    with _ALEMBIC_LOCK:
        command.upgrade(alembic_config(service, database_url), revision)


def upgrade_all(database_url: str) -> list[str]:
    services = services_with_migrations()
    for service in services:
        upgrade(service, database_url)
    return services
