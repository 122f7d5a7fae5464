"""Kernel settings read from `GYRE_*` environment variables (shell).

Each service adds its own settings class with the prefix `GYRE_<SERVICE>_`. The NATS and
database URLs may be unset: then `resolve_urls` takes them from the local stack's state file
written by `gyre up` (DESIGN section 7, embedded defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic_settings import BaseSettings, SettingsConfigDict

from gyre.errors import Unavailable

DEFAULT_MAX_AGE_S = 7 * 24 * 3600.0
DEFAULT_MAX_BYTES = 0


class KernelSettings(BaseSettings):
    """Settings every process shares."""

    model_config = SettingsConfigDict(env_prefix="GYRE_", extra="ignore")

    nats_url: str | None = None
    """NATS server with JetStream, e.g. nats://127.0.0.1:4222; unset: the local stack's."""
    database_url: str | None = None
    """SQLAlchemy URL, e.g. postgresql+asyncpg://postgres@127.0.0.1:5432/gyre; unset: the local stack's."""
    nats_password_file: Path | None = None
    """A file holding the NATS password, added to `nats_url` (deploy/ mounts it from a secret)."""
    database_password_file: Path | None = None
    """A file holding the Postgres password, added to `database_url`."""
    bus_prefix: str = "gyre"
    """First token of every subject and stream name; tests use their own to run side by side."""
    stream_max_age_s: float = DEFAULT_MAX_AGE_S
    """How long JetStream keeps an event (Postgres keeps the durable record)."""
    stream_max_bytes: int = DEFAULT_MAX_BYTES
    """Most bytes one JetStream stream holds, the oldest events going first; 0: no byte limit
    (the server reserves a stream's max_bytes against its storage, so a shared server fills up
    with reservations of streams that hold little)."""
    state_dir: Path = Path(".gyre")
    """Where the local stack keeps its servers' data, logs and state file."""
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics_port: int | None = None
    """Prometheus metrics endpoint (`/metrics`); unset: none is served; 0: a free port (logged)."""
    metrics_host: str = "127.0.0.1"
    """Where the metrics endpoint binds; containers set 0.0.0.0 so a scraper on their network reaches it."""
    trace_exporter: Literal["none", "console"] = "none"
    """Trace ids always travel with RPCs and events; `console` also records spans and prints them."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoints:
    nats_url: str
    database_url: str


def stack_state_path(state_dir: Path) -> Path:
    return state_dir / "stack.json"


def resolve_urls(settings: KernelSettings) -> Endpoints:
    """Environment first, then the running local stack; a clear error when neither exists."""
    nats_url, database_url = settings.nats_url, settings.database_url
    state_path = stack_state_path(settings.state_dir)
    if (nats_url is None or database_url is None) and state_path.exists():
        state = json.loads(state_path.read_text())
        nats_url = nats_url or state.get("nats_url")
        database_url = database_url or state.get("database_url")
    if nats_url is None or database_url is None:
        missing = [
            n for n, v in (("GYRE_NATS_URL", nats_url), ("GYRE_DATABASE_URL", database_url)) if v is None
        ]
        raise Unavailable(f"{' and '.join(missing)} unset and no local stack at {state_path}: run `gyre up`")
    return Endpoints(
        nats_url=_with_password(nats_url, settings.nats_password_file, "GYRE_NATS_PASSWORD_FILE"),
        database_url=_with_password(
            database_url, settings.database_password_file, "GYRE_DATABASE_PASSWORD_FILE"
        ),
    )


def resolve_database_url(settings: KernelSettings) -> str:
    """The database alone, for what needs no bus (`gyre migrate`: deploy/'s migrations job is
    told only its database); resolved as `resolve_urls` resolves it, password included."""
    url = _one_url(settings, settings.database_url, "database_url", "GYRE_DATABASE_URL")
    return _with_password(url, settings.database_password_file, "GYRE_DATABASE_PASSWORD_FILE")


def resolve_nats_url(settings: KernelSettings) -> str:
    """The bus alone, for what owns no tables (the engine); password included."""
    url = _one_url(settings, settings.nats_url, "nats_url", "GYRE_NATS_URL")
    return _with_password(url, settings.nats_password_file, "GYRE_NATS_PASSWORD_FILE")


def _one_url(settings: KernelSettings, url: str | None, key: str, setting: str) -> str:
    state_path = stack_state_path(settings.state_dir)
    if url is None and state_path.exists():
        url = json.loads(state_path.read_text()).get(key)
    if url is None:
        raise Unavailable(f"{setting} unset and no local stack at {state_path}: run `gyre up`")
    return url


def _with_password(url: str, password_file: Path | None, setting: str) -> str:
    """`url` with the password read from `password_file` (and its user, `gyre` when it names none).

    Example: _with_password("nats://nats:4222", Path("/run/pw"), ...) -> "nats://gyre:<pw>@nats:4222"
    """
    if password_file is None:
        return url
    try:
        password = password_file.read_text().strip()
    except OSError as exc:
        raise Unavailable(f"{setting} {password_file} cannot be read: {exc.strerror}") from exc
    parts = urlsplit(url)
    user = unquote(parts.username or "gyre")
    host = parts.hostname or ""
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{host}" + (
        f":{parts.port}" if parts.port else ""
    )
    return urlunsplit(parts._replace(netloc=netloc))
