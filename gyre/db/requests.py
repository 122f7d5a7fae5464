"""The answers to mutating RPCs by client-chosen `request_id`, so a repeat gets the first answer (shell).

Every service keeps one `rpc_requests` table in its own schema (`requests_table`), and every
mutating RPC goes through `RequestLog.answer_once`: a request id already answered gets the stored
answer without running anything; otherwise the method's work (`act`) runs and its answer is
stored in the same transaction as the work's own writes, so both commit or neither does. Two
concurrent calls with one id: the second waits on the first's claim, rolls back what it did and
returns the first's answer. A reused id with another method or body is a `Conflict`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

import sqlalchemy as sa
from google.protobuf.message import Message
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import Conflict
from gyre.ids import validate_request_id

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


class _LostRace(Exception):
    """A concurrent call with the same request id stored its answer first."""


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

    async def answered(
        self, sessions: async_sessionmaker[AsyncSession], *, method: str, request: Message, cls: type[M]
    ) -> M | None:
        """The stored answer to `request` (validating its id first), or None if it is new."""
        validate_request_id(getattr(request, "request_id"))  # noqa: B009
        async with sessions() as session:
            return await self.first_answer(session, method=method, request=request, cls=cls)

    async def answer_once(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        method: str,
        request: Message,
        cls: type[M],
        act: Callable[[AsyncSession], Awaitable[M]],
    ) -> tuple[M, bool]:
        """(answer, fresh): the stored answer, or `act`'s, committed with the claim of the id.

        `act` may do slow work before its first statement: the session holds no connection until then.
        """
        first = await self.answered(sessions, method=method, request=request, cls=cls)
        if first is not None:
            return first, False
        request_id: str = getattr(request, "request_id")  # noqa: B009
        try:
            async with sessions() as session, session.begin():
                answer = await act(session)
                if not await self.claim(
                    session,
                    request_id=request_id,
                    method=method,
                    fingerprint=request_fingerprint(request),
                    response=answer.SerializeToString(),
                ):
                    raise _LostRace
        except _LostRace:
            winner = await self.answered(sessions, method=method, request=request, cls=cls)
            assert winner is not None
            return winner, False
        return answer, True
