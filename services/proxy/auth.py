"""Map a harness credential to its execution (shell: Postgres, with a short cache).

Only the SHA-256 of a token is stored. A hit is cached for `cache_s` so a busy harness does not
cost a database round trip per call; revocations made through this process drop the cache at
once, those made through another proxy replica take effect within `cache_s`.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import GyreError, Unavailable
from gyre.outages import is_outage
from services.proxy import repo

log = structlog.get_logger(__name__)


class Unauthenticated(GyreError):
    """No usable credential: missing, unknown, revoked or expired (HTTP 401)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Entry:
    execution_id: str
    expires_at: datetime
    fetched_s: float


def token_digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def bearer_token(authorization: str, api_key: str) -> str:
    """The presented token: `x-api-key` (Anthropic) or `Authorization: Bearer` (both APIs)."""
    if api_key:
        return api_key.strip()
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return ""


class TokenBook:
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], *, cache_s: float = 5.0, hold_s: float = 30.0
    ) -> None:
        self.sessions = sessions
        self.cache_s = cache_s
        self.hold_s = hold_s
        self._cache: dict[bytes, _Entry] = {}

    async def execution_of(self, token: str) -> str:
        if not token:
            raise Unauthenticated(
                "missing credential: send the execution token as a Bearer token or x-api-key"
            )
        digest = token_digest(token)
        now = datetime.now(UTC)
        entry = self._cache.get(digest)
        if entry is None or time.monotonic() - entry.fetched_s > self.cache_s:
            entry = await self._fetch(digest, stale=entry)
        if entry.expires_at <= now:
            self._cache.pop(digest, None)
            raise Unauthenticated("expired credential: the execution's token has expired")
        return entry.execution_id

    async def _fetch(self, digest: bytes, *, stale: _Entry | None) -> _Entry:
        """The token's entry from Postgres. While Postgres is away (a restart), a token known
        before keeps working (revocations through this process drop it from the cache at once)
        and an unknown one waits up to `hold_s`, then gets Unavailable (HTTP 503, which harnesses
        retry), never a 500 that loses the call."""
        deadline = time.monotonic() + self.hold_s
        for attempt in range(10_000):  # bounded by the deadline
            try:
                async with self.sessions() as session:
                    row = await repo.load_token(session, digest)
                break
            except Exception as exc:
                if not is_outage(exc):
                    raise
                if stale is not None:
                    log.warning("token_checked_from_cache", error=type(exc).__name__)
                    return stale
                if time.monotonic() > deadline:
                    raise Unavailable("the proxy cannot check credentials right now; retry shortly") from exc
                await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
        else:
            raise Unavailable("the proxy cannot check credentials right now; retry shortly")
        if row is None:
            raise Unauthenticated("unknown credential: this token belongs to no execution")
        execution_id, expires_at, revoked = row
        if revoked:
            raise Unauthenticated("revoked credential: the execution's token was revoked")
        entry = _Entry(execution_id=execution_id, expires_at=expires_at, fetched_s=time.monotonic())
        self._cache[digest] = entry
        return entry

    def forget_execution(self, execution_id: str) -> None:
        for digest, entry in list(self._cache.items()):
            if entry.execution_id == execution_id:
                del self._cache[digest]
