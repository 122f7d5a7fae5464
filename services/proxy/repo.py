"""The proxy's own tables and their queries (shell: SQLAlchemy 2 async)."""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.db.requests import RequestLog, requests_table
from gyre.db.tables import outbox_table, processed_messages_table
from services.proxy.render import ReusableOutput
from services.proxy.routing import Route

SCHEMA = "proxy"
metadata = sa.MetaData(schema=SCHEMA)

execution_tokens = sa.Table(
    "execution_tokens",
    metadata,
    sa.Column("token_sha256", sa.LargeBinary, primary_key=True),
    sa.Column("execution_id", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True)),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    sa.Column("min_policy_version", sa.BigInteger, nullable=False, server_default="0"),  # 0005
)

engine_routes = sa.Table(
    "engine_routes",
    metadata,
    sa.Column("engine_id", sa.Text, primary_key=True),
    sa.Column("cell_id", sa.Text, nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

reusable_outputs = sa.Table(
    "reusable_outputs",
    metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("segment_sha256", sa.LargeBinary, primary_key=True),
    sa.Column("segment", sa.Text, nullable=False),
    sa.Column("gen_prefix", sa.Text, nullable=False),
    sa.Column("ids", sa.LargeBinary, nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

recorded_calls = sa.Table(
    "recorded_calls",
    metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("num_calls", sa.Integer, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)

failed_calls = sa.Table(
    "failed_calls",
    metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("num_calls", sa.Integer, nullable=False),
    sa.Column("last_message", sa.Text, nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)
"""Model calls the proxy answered with a failure of its own (HTTP 5xx), per execution (0006)."""

call_answers = sa.Table(
    "call_answers",
    metadata,
    sa.Column("execution_id", sa.Text, primary_key=True),
    sa.Column("call_key", sa.Text, primary_key=True),
    sa.Column("answer", sa.LargeBinary, nullable=False),
    sa.Column("delivered", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
)
"""Recorded calls' answers by (execution, call key): a harness's retry is answered from here."""

requests = RequestLog(requests_table(metadata))

outbox = outbox_table(metadata)
processed_messages = processed_messages_table(metadata)


async def upsert_token(
    session: AsyncSession,
    *,
    token_sha256: bytes,
    execution_id: str,
    task_id: str,
    expires_at: datetime,
    min_policy_version: int = 0,
) -> str:
    """Store a token; returns the execution it maps to (the first one, if it was registered before)."""
    stmt = (
        insert(execution_tokens)
        .values(
            token_sha256=token_sha256,
            execution_id=execution_id,
            task_id=task_id,
            expires_at=expires_at,
            min_policy_version=min_policy_version,
        )
        .on_conflict_do_nothing()
    )
    await session.execute(stmt)
    row = (
        await session.execute(
            sa.select(execution_tokens.c.execution_id).where(execution_tokens.c.token_sha256 == token_sha256)
        )
    ).one()
    return str(row.execution_id)


async def load_token(session: AsyncSession, token_sha256: bytes) -> Any | None:
    """The token's row (execution_id, expires_at, revoked_at, min_policy_version), or None."""
    t = execution_tokens.c
    stmt = sa.select(t.execution_id, t.expires_at, t.revoked_at, t.min_policy_version).where(
        t.token_sha256 == token_sha256
    )
    return (await session.execute(stmt)).first()


async def revoke_tokens(session: AsyncSession, execution_id: str, *, now: datetime) -> int:
    stmt = (
        sa.update(execution_tokens)
        .where(
            execution_tokens.c.execution_id == execution_id,
            execution_tokens.c.revoked_at.is_(None),
            execution_tokens.c.expires_at > now,
        )
        .values(revoked_at=now)
    )
    result = await session.execute(stmt)
    return int(result.rowcount)  # type: ignore[attr-defined]


async def save_route(session: AsyncSession, route: Route) -> None:
    values = {"cell_id": route.cell_id, "address": route.address, "state": route.state}
    stmt = insert(engine_routes).values(engine_id=route.engine_id, **values)
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[engine_routes.c.engine_id], set_={**values, "updated_at": sa.func.now()}
        )
    )


async def load_routes(session: AsyncSession) -> list[Route]:
    rows = (await session.execute(sa.select(engine_routes).order_by(engine_routes.c.cell_id))).all()
    return [Route(cell_id=r.cell_id, engine_id=r.engine_id, address=r.address, state=r.state) for r in rows]


async def save_outputs(session: AsyncSession, items: Sequence[tuple[str, ReusableOutput]]) -> None:
    """Keep (execution_id, output) pairs so a restarted proxy still reuses the engine's ids."""
    if not items:
        return
    rows = [
        {
            "execution_id": execution_id,
            "segment_sha256": hashlib.sha256(item.segment.encode()).digest(),
            "segment": item.segment,
            "gen_prefix": item.gen_prefix,
            "ids": array("i", item.ids).tobytes(),
        }
        for execution_id, item in items
        # Postgres text cannot hold NUL, and a failed insert would lose the call records written
        # in the same transaction: such an output is reused in this process only.
        if "\x00" not in item.segment and "\x00" not in item.gen_prefix
    ]
    if rows:
        await session.execute(insert(reusable_outputs).values(rows).on_conflict_do_nothing())


async def load_outputs(session: AsyncSession, execution_id: str) -> list[ReusableOutput]:
    rows = (
        await session.execute(
            sa.select(reusable_outputs.c.segment, reusable_outputs.c.gen_prefix, reusable_outputs.c.ids)
            .where(reusable_outputs.c.execution_id == execution_id)
            .order_by(reusable_outputs.c.created_at)
        )
    ).all()
    out = []
    for row in rows:
        ids = array("i")
        ids.frombytes(row.ids)
        out.append(ReusableOutput(segment=row.segment, gen_prefix=row.gen_prefix, ids=tuple(ids)))
    return out


async def forget_outputs(session: AsyncSession, execution_id: str) -> None:
    """Drop what the proxy kept for an execution's later calls (its token is revoked)."""
    await session.execute(sa.delete(reusable_outputs).where(reusable_outputs.c.execution_id == execution_id))
    await session.execute(sa.delete(call_answers).where(call_answers.c.execution_id == execution_id))


async def save_answers(session: AsyncSession, rows: Sequence[tuple[str, str, dict[str, Any]]]) -> None:
    """(execution_id, call_key, answer): the newest answer of a key replaces an older one."""
    if not rows:
        return
    stmt = insert(call_answers).values(
        [{"execution_id": e, "call_key": k, "answer": json.dumps(a).encode()} for e, k, a in rows]
    )
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[call_answers.c.execution_id, call_answers.c.call_key],
            set_={"answer": stmt.excluded.answer, "delivered": False},
        )
    )


async def mark_delivered(session: AsyncSession, pairs: Sequence[tuple[str, str]]) -> None:
    """(execution_id, call_key) answers the harness received whole."""
    if pairs:
        await session.execute(
            sa.update(call_answers)
            .where(sa.tuple_(call_answers.c.execution_id, call_answers.c.call_key).in_(pairs))
            .values(delivered=True)
        )


async def load_answers(session: AsyncSession, execution_id: str) -> list[tuple[str, dict[str, Any], bool]]:
    """(call_key, answer, delivered) of an execution's recorded calls."""
    table = call_answers.c
    rows = (
        await session.execute(
            sa.select(table.call_key, table.answer, table.delivered).where(table.execution_id == execution_id)
        )
    ).all()
    return [(row.call_key, json.loads(row.answer), row.delivered) for row in rows]


async def count_calls(session: AsyncSession, counts: Mapping[str, int]) -> None:
    """Add newly recorded calls to their executions' counts (in the transaction of the records)."""
    if not counts:
        return
    stmt = insert(recorded_calls).values(
        [{"execution_id": e, "num_calls": n} for e, n in sorted(counts.items())]
    )
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[recorded_calls.c.execution_id],
            set_={
                "num_calls": recorded_calls.c.num_calls + stmt.excluded.num_calls,
                "updated_at": sa.func.now(),
            },
        )
    )


async def recorded_call_count(session: AsyncSession, execution_id: str) -> int:
    """How many calls of an execution have a durable record (0 when none)."""
    row = (
        await session.execute(
            sa.select(recorded_calls.c.num_calls).where(recorded_calls.c.execution_id == execution_id)
        )
    ).first()
    return 0 if row is None else int(row.num_calls)


async def count_failed_call(session: AsyncSession, execution_id: str, message: str) -> None:
    """Add one call the proxy failed to its execution's count, keeping the newest message."""
    stmt = insert(failed_calls).values(execution_id=execution_id, num_calls=1, last_message=message)
    await session.execute(
        stmt.on_conflict_do_update(
            index_elements=[failed_calls.c.execution_id],
            set_={
                "num_calls": failed_calls.c.num_calls + 1,
                "last_message": stmt.excluded.last_message,
                "updated_at": sa.func.now(),
            },
        )
    )


async def failed_call_count(session: AsyncSession, execution_id: str) -> tuple[int, str]:
    """(how many of an execution's calls the proxy failed, the last one's message); (0, "") if none."""
    row = (
        await session.execute(
            sa.select(failed_calls.c.num_calls, failed_calls.c.last_message).where(
                failed_calls.c.execution_id == execution_id
            )
        )
    ).first()
    return (0, "") if row is None else (int(row.num_calls), str(row.last_message))
