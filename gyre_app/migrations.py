"""Every service's schema migrations, found where each service keeps them (shell).

The kernel's `gyre.db.migrate.upgrade` takes a folder; this module knows the services'
layout (`services/<name>/migrations/`), for `gyre migrate`, `gyre up`, tests and benchmarks.
"""

from __future__ import annotations

from pathlib import Path

from gyre.db import migrate

SERVICES_ROOT = Path(__file__).resolve().parents[1] / "services"


def migrations_dir(service: str) -> Path:
    return SERVICES_ROOT / service / "migrations"


def services_with_migrations() -> list[str]:
    return sorted(p.parent.parent.name for p in SERVICES_ROOT.glob("*/migrations/env.py"))


def upgrade(service: str, database_url: str, revision: str = "head") -> None:
    """Bring `service`'s schema (named after it) to `revision`; blocking."""
    migrate.upgrade(service, database_url, script_location=migrations_dir(service), revision=revision)


def upgrade_all(database_url: str) -> list[str]:
    services = services_with_migrations()
    for service in services:
        upgrade(service, database_url)
    return services
