"""Replay the call log into a scratch schema and diff the projections against the live ones (shell).

The call log (`trajectory.calls`) is the service's append-only event log; `executions` (tree
headers), `trajectories` and `tree_calls` are projections folded from it. A replay picks a range
of the log, folds every execution it touches from that execution's first call (a tree needs all
of them) into tables of a fresh scratch schema shaped like the live ones, and compares the two
row by row with SQL. The projections hold positions, chains and counts, never tokens, so the
fold reads each row's lengths and parents (`fold_header`) and leaves its token payload unread.
The scratch schema is dropped afterwards unless asked to be kept.

Ranges: every execution; named executions; the executions with a call recorded at or after a
time (`since`); or those with a call at or after a position of the log, the log being ordered by
(recorded_at, execution_id, seq) and position 0 its first call. A range that selects nothing is
an error that says where the log ends.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from operator import itemgetter
from typing import Any

from gyre.db.outbox_replay import TableDiff
from gyre.errors import InvalidArgument, NotFound
from services.trajectory.call_log import (
    SHAPE_COLUMNS,
    TRAJECTORY_COLUMNS,
    S,
    shape_rows,
    trajectory_rows,
)
from services.trajectory.layout import call_shapes
from services.trajectory.projection import CallHeader, build_shape

HEADER_COLUMNS = ("execution_id", "num_calls", "num_unique_tokens", "num_flat_tokens")
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "executions": HEADER_COLUMNS,
    "trajectories": TRAJECTORY_COLUMNS,
    "tree_calls": SHAPE_COLUMNS,
}
LOG_ORDER = "recorded_at, execution_id, seq"
# The log columns a projection depends on: its token payloads never are (positions, chains and
# counts follow from the stored lengths and parents), so a replay reads and decodes no token.
HEADER_FIELDS = (
    "seq",
    "call_id",
    "agent_role",
    "agent_id",
    "prompt_parent",
    "num_shared_prompt",
    "num_new_prompt",
    "output_parent",
    "num_shared_output",
    "num_output",
)
FETCH_ROWS = 10_000
FLUSH_CALLS = 20_000


@dataclass(frozen=True, slots=True, kw_only=True)
class LogRange:
    execution_ids: tuple[str, ...] = ()
    since: datetime | None = None
    from_position: int | None = None

    def check(self) -> LogRange:
        chosen = sum((bool(self.execution_ids), self.since is not None, self.from_position is not None))
        if chosen > 1:
            raise InvalidArgument("range", "give at most one of executions, a time (since) or a position")
        if self.from_position is not None and self.from_position < 0:
            raise InvalidArgument("from_position", f"must be >= 0, got {self.from_position}")
        return self


ProjectionDiff = TableDiff
"""A projection's rows, live against replayed: the kernel's outbox replay shape."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogReplay:
    schema: str
    num_executions: int
    num_calls: int
    replay_s: float
    diffs: list[ProjectionDiff]

    @property
    def same(self) -> bool:
        return all(d.same for d in self.diffs)


async def select_executions(pg: Any, log_range: LogRange) -> list[str]:
    """The executions the range touches, in log order of their first touched call."""
    total, first_at, last_at = await pg.fetchrow(
        f"SELECT count(*), min(recorded_at), max(recorded_at) FROM {S}.calls"
    )
    if total == 0:
        raise NotFound("the call log is empty: nothing to replay")
    if log_range.execution_ids:
        known = {
            r["execution_id"]
            for r in await pg.fetch(
                f"SELECT DISTINCT execution_id FROM {S}.calls WHERE execution_id = ANY($1)",
                list(log_range.execution_ids),
            )
        }
        missing = [e for e in log_range.execution_ids if e not in known]
        if missing:
            raise NotFound(f"no call recorded for execution {missing[0]}")
        return list(dict.fromkeys(log_range.execution_ids))
    if log_range.since is not None:
        rows = await pg.fetch(
            f"SELECT execution_id FROM {S}.calls WHERE recorded_at >= $1 GROUP BY execution_id "
            "ORDER BY min(recorded_at), execution_id",
            log_range.since,
        )
        if not rows:
            raise NotFound(
                f"no call recorded since {log_range.since.isoformat()}: the log spans {first_at} .. {last_at}"
            )
        return [r["execution_id"] for r in rows]
    position = log_range.from_position or 0
    if position >= total:
        raise NotFound(
            f"position {position} is past the end of the call log ({total} calls, positions 0..{total - 1})"
        )
    rows = await pg.fetch(
        f"SELECT execution_id FROM (SELECT execution_id, row_number() OVER (ORDER BY {LOG_ORDER}) - 1 AS pos "
        f"FROM {S}.calls) log WHERE pos >= $1 GROUP BY execution_id ORDER BY min(pos)",
        position,
    )
    return [r["execution_id"] for r in rows]


async def create_scratch(pg: Any, schema: str) -> None:
    """A schema with empty tables shaped like the live projections. Unlogged: a scratch copy is
    thrown away, so writing it to the WAL would only slow the replay down."""
    await pg.execute(f'CREATE SCHEMA "{schema}"')
    for table in PROJECTIONS:
        await pg.execute(f'CREATE UNLOGGED TABLE "{schema}".{table} (LIKE {S}.{table} INCLUDING DEFAULTS)')


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The fold allocates many small objects that all live until their chunk is written, so the
    cyclic collector's scans find nothing to free and cost about a quarter of the replay."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


async def replay_into(pg: Any, schema: str, execution_ids: Sequence[str]) -> int:
    """Fold the executions' whole logs into the scratch schema's projections; the number of calls folded.

    One server-side cursor streams the log rows in (execution, seq) order, in batches of
    FETCH_ROWS: one scan of the log, where a query per group of executions scanned it each time.
    Each execution is folded as soon as its last row is in, and the projection rows are COPied
    every FLUSH_CALLS calls, so memory stays bounded by a batch, not by the log.
    """
    with _collector_paused():
        async with pg.transaction():
            return await _replay_stream(pg, schema, list(execution_ids))


class _Projections:
    """Projection rows folded and not yet written to the scratch schema."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[Any, ...]]] = {table: [] for table in PROJECTIONS}
        self.num_calls = 0

    def add(self, execution_id: str, calls: Sequence[CallHeader]) -> None:
        tree = build_shape(execution_id, calls)
        self.rows["executions"].append((execution_id, len(tree.calls), tree.n, tree.num_flat_tokens))
        self.rows["trajectories"] += trajectory_rows(tree, range(len(tree.chains)))
        self.rows["tree_calls"] += shape_rows(execution_id, call_shapes(tree))
        self.num_calls += len(calls)

    async def flush(self, pg: Any, schema: str) -> None:
        for table, records in self.rows.items():
            if records:
                await pg.copy_records_to_table(
                    table, schema_name=schema, records=records, columns=PROJECTIONS[table]
                )
            records.clear()


async def _replay_stream(pg: Any, schema: str, execution_ids: list[str]) -> int:
    out = _Projections()
    cursor = await pg.cursor(
        f"SELECT execution_id, {', '.join(HEADER_FIELDS)} FROM {S}.calls WHERE execution_id = ANY($1) "
        "ORDER BY execution_id, seq",
        execution_ids,
    )
    seen: set[str] = set()
    tail: list[Any] = []  # the rows of the last execution of a batch: it may go on in the next one
    written = 0
    fetching = asyncio.ensure_future(cursor.fetch(FETCH_ROWS))
    while True:
        rows = await fetching
        if out.num_calls - written >= FLUSH_CALLS:  # the connection is idle only between fetches
            await out.flush(pg, schema)
            written = out.num_calls
        if not rows:
            break
        # Postgres reads and sends the next batch while this one is folded.
        fetching = asyncio.ensure_future(cursor.fetch(FETCH_ROWS))
        rows = tail + rows
        last = rows[-1][0]
        cut = len(rows)
        while cut and rows[cut - 1][0] == last:
            cut -= 1
        tail = rows[cut:]
        for execution_id, group in itertools.groupby(rows[:cut], key=itemgetter(0)):
            out.add(execution_id, [_header(r) for r in group])
            seen.add(execution_id)
    if tail:
        out.add(tail[0][0], [_header(r) for r in tail])
        seen.add(tail[0][0])
    for execution_id in execution_ids:  # named, but nothing in the log: an empty tree's header
        if execution_id not in seen:
            out.add(execution_id, [])
            seen.add(execution_id)
    await out.flush(pg, schema)
    return out.num_calls


def _header(r: Any) -> CallHeader:
    """A log row read with HEADER_FIELDS (after its execution_id) as a CallHeader."""
    return CallHeader(
        seq=r[1],
        call_id=r[2],
        agent_role=r[3],
        agent_id=r[4],
        prompt_parent=r[5],
        num_shared_prompt=r[6],
        num_new_prompt=r[7],
        output_parent=r[8],
        num_shared_output=r[9],
        output_len=r[10],
    )


async def diff_projections(
    pg: Any, schema: str, execution_ids: Sequence[str], *, max_rows: int = 5
) -> list[ProjectionDiff]:
    diffs = []
    ids = list(execution_ids)
    for table, columns in PROJECTIONS.items():
        cols = ", ".join(columns)
        live = f"SELECT {cols} FROM {S}.{table} WHERE execution_id = ANY($1)"
        replayed = f'SELECT {cols} FROM "{schema}".{table}'
        only_live = await pg.fetch(f"({live}) EXCEPT ({replayed}) ORDER BY 1, 2 LIMIT {max_rows}", ids)
        only_replayed = await pg.fetch(f"({replayed}) EXCEPT ({live}) ORDER BY 1, 2 LIMIT {max_rows}", ids)
        diffs.append(
            ProjectionDiff(
                table=table,
                num_live=await pg.fetchval(f"SELECT count(*) FROM ({live}) x", ids),
                num_replayed=await pg.fetchval(f'SELECT count(*) FROM "{schema}".{table}'),
                only_live=[dict(r) for r in only_live],
                only_replayed=[dict(r) for r in only_replayed],
            )
        )
    return diffs


async def replay_and_diff(pg: Any, log_range: LogRange, *, keep_scratch: bool = False) -> LogReplay:
    """Replay the range into `trajectory_replay_<hex>` and diff it against the live projections.

    One repeatable-read transaction reads the log and the live projections, so calls ingested
    meanwhile (log rows and projections commit together) cannot make them disagree. Without
    `keep_scratch` the scratch schema is dropped in it; an error rolls all of it back.
    """
    async with pg.transaction(isolation="repeatable_read"):
        execution_ids = await select_executions(pg, log_range.check())
        schema = f"trajectory_replay_{uuid.uuid4().hex[:10]}"
        await create_scratch(pg, schema)
        t0 = time.perf_counter()
        num_calls = await replay_into(pg, schema, execution_ids)
        replay_s = time.perf_counter() - t0
        diffs = await diff_projections(pg, schema, execution_ids)
        if not keep_scratch:
            await pg.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return LogReplay(
        schema=schema, num_executions=len(execution_ids), num_calls=num_calls, replay_s=replay_s, diffs=diffs
    )
