"""Count the model calls the proxy answers with a failure of its own, per execution (shell: Postgres).

A harness whose model calls the proxy fails (HTTP 5xx: no engine serving, none with new enough
weights, the engine lost mid-call with none to fail over to, an internal error) and that then
gives up did not fail on the policy's account. The runner learns this count when it revokes the
execution's token (`RevokeExecutionToken`) and ends such an execution as `MODEL_UNAVAILABLE`, an
infrastructure failure, instead of having what the harness left graded. Client errors (4xx) are
the harness's own and are not counted. A failure is counted before the harness is answered, so
once the harness has exited every failure it saw is in the count.
"""

from __future__ import annotations

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.outages import is_outage
from services.proxy import repo

log = structlog.get_logger(__name__)
MAX_MESSAGE_CHARS = 2000


class FailedCalls:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def count(self, execution_id: str, message: str) -> None:
        """Add one failed call to the execution's count; best effort: the harness's answer must
        still go out when Postgres is away (often the very failure being answered)."""
        try:
            async with self.sessions() as session, session.begin():
                await repo.count_failed_call(
                    session, execution_id, message.replace("\x00", "")[:MAX_MESSAGE_CHARS]
                )
        except Exception as exc:
            log.warning(
                "failed_call_not_counted",
                execution_id=execution_id,
                error=type(exc).__name__,
                exc_info=not is_outage(exc),
            )
