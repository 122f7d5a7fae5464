"""Idempotent consumption: claim an event id inside the consumer's transaction (shell)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession


async def claim_event(session: AsyncSession, inbox: sa.Table, *, consumer: str, event_id: str) -> bool:
    """Record (consumer, event_id); False when it was already processed (skip the work).

    Must run in the same transaction as the handler's writes, so both commit or neither does.
    """
    stmt = (
        insert(inbox)
        .values(consumer=consumer, event_id=uuid.UUID(event_id))
        .on_conflict_do_nothing()
        .returning(inbox.c.event_id)
    )
    return (await session.execute(stmt)).first() is not None
