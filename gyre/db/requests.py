"""The answers to mutating RPCs by client-chosen `request_id`, so a repeat gets the first answer (shell).

Every service with idempotent RPCs keeps one such table in its own schema; this module holds the
table's shape and the two statements on it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TypeVar

import sqlalchemy as sa
from google.protobuf.message import Message
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.errors import Conflict

M = TypeVar("M", bound=Message)


def request_fingerprint(request: Message) -> bytes:
    """Digest of a request without its `request_id`: a reused id with another body is a conflict."""
    body = type(request)()
    body.CopyFrom(request)
    body.request_id = ""  # type: ignore[attr-defined]
    return hashlib.sha256(body.SerializeToString(deterministic=True)).digest()


def requests_table(metadata: sa.MetaData) -> sa.Table:
    """`rpc_requests`: one row per request id with the method, a fingerprint of the request and the answer."""
    return sa.Table(
        "rpc_requests",
        metadata,
        sa.Column("request_id", sa.Text, primary_key=True),
        sa.Column("method", sa.Text, nullable=False),
        sa.Column("fingerprint", sa.LargeBinary, nullable=False),
        sa.Column("response", sa.LargeBinary, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


@dataclass(frozen=True, slots=True)
class RequestLog:
    """Claim and look up request ids in one service's `rpc_requests` table."""

    table: sa.Table

    async def claim(
        self, session: AsyncSession, *, request_id: str, method: str, fingerprint: bytes, response: bytes
    ) -> bool:
        """Record the answer to a request id; False when the id was taken (by a concurrent call too)."""
        stmt = (
            insert(self.table)
            .values(request_id=request_id, method=method, fingerprint=fingerprint, response=response)
            .on_conflict_do_nothing()
            .returning(self.table.c.request_id)
        )
        return (await session.execute(stmt)).first() is not None

    async def first_answer(
        self, session: AsyncSession, *, method: str, request: Message, cls: type[M]
    ) -> M | None:
        """The answer recorded for `request.request_id`, or None; Conflict when that id was used
        for another method or another body."""
        request_id: str = getattr(request, "request_id")  # noqa: B009
        row = await self.load(session, request_id)
        if row is None:
            return None
        if row[0] != method or row[1] != request_fingerprint(request):
            raise Conflict(f"request_id {request_id!r} was already used for a different request")
        return cls.FromString(row[2])

    async def load(self, session: AsyncSession, request_id: str) -> tuple[str, bytes, bytes] | None:
        """(method, fingerprint, response) recorded for a request id, or None."""
        columns = self.table.c
        stmt = sa.select(columns.method, columns.fingerprint, columns.response).where(
            columns.request_id == request_id
        )
        row = (await session.execute(stmt)).first()
        return None if row is None else (row.method, row.fingerprint, row.response)
