"""Rebuild a service's event-sourced columns from its outbox into a scratch schema and diff them
against the live tables (shell: asyncpg).

Every service writes the events it publishes to its `outbox` in the same transaction as the state
they describe, and the outbox keeps them after publication: it is the service's event log. A
service that can rebuild some of its tables' columns from those events describes them with an
`EventProjection`: which tables, their key, the columns the events determine, and a pure `fold`
from events to rows. This module holds the plumbing only: read the log, fold it, COPY the rows
into a fresh scratch schema (tables shaped like the live columns), compare with SQL, drop it.

Ranges: the whole log, the events at or after a position (0 = the first event, in outbox order),
or those recorded at or after a time. The fold always reads the log from its start (a row needs
every event of its key); the range picks which rows are rebuilt and compared: those an event in
the range touches. A range past the end of the log is an error that says where the log ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from google.protobuf import message

from gyre.common.v1 import envelope_pb2
from gyre.errors import InvalidArgument, NotFound
from gyre.events import DecodedEvent, type_map, unpack_payload

Row = tuple[Any, ...]
Fold = Callable[[Sequence[envelope_pb2.Envelope]], Mapping[str, Mapping[Row, Row]]]
"""Events in log order -> per table, rows by key (each row: the table's `columns`, key first)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TableProjection:
    table: str
    key: tuple[str, ...]
    columns: tuple[str, ...]
    """The columns the events determine, the key's first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EventProjection:
    """What of a service's tables its own events determine, and how to fold them."""

    service: str
    schema: str
    tables: tuple[TableProjection, ...]
    fold: Fold
    not_replayed: str
    """What the events do not determine (said in the command's help and output, never faked)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxRange:
    since: datetime | None = None
    from_position: int | None = None

    def check(self) -> OutboxRange:
        if self.since is not None and self.from_position is not None:
            raise InvalidArgument("range", "give a time (since) or a position, not both")
        if self.from_position is not None and self.from_position < 0:
            raise InvalidArgument("from_position", f"must be >= 0, got {self.from_position}")
        return self


@dataclass(frozen=True, slots=True, kw_only=True)
class TableDiff:
    table: str
    num_live: int
    num_replayed: int
    only_live: list[dict[str, Any]] = field(default_factory=list)
    """Live rows (of the keys replayed) the log does not produce, at most `max_rows` shown."""
    only_replayed: list[dict[str, Any]] = field(default_factory=list)
    """Rows the log produces that the live table lacks or holds differently."""

    @property
    def same(self) -> bool:
        return not self.only_live and not self.only_replayed


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxReplay:
    schema: str
    num_events: int
    """Events in the range."""
    replay_s: float
    diffs: list[TableDiff]

    @property
    def same(self) -> bool:
        return all(d.same for d in self.diffs)


def decoded(
    events: Sequence[envelope_pb2.Envelope], classes: Sequence[type[message.Message]]
) -> Iterator[DecodedEvent]:
    """The events of the given types, in log order, with their payloads unpacked."""
    types = type_map(classes)
    for envelope in events:
        event = unpack_payload(envelope, envelope.payload, types)
        if event is not None:
            yield event


async def read_log(pg: Any, schema: str, log_range: OutboxRange) -> tuple[list[envelope_pb2.Envelope], int]:
    """Every event of the service's outbox in order, and the index of the range's first one."""
    rows = await pg.fetch(f'SELECT envelope, created_at FROM "{schema}".outbox ORDER BY seq')
    if not rows:
        raise NotFound(f"the {schema} event log (its outbox) is empty: nothing to replay")
    first, last = rows[0]["created_at"], rows[-1]["created_at"]
    start = 0
    if log_range.from_position is not None:
        start = log_range.from_position
        if start >= len(rows):
            raise NotFound(
                f"position {start} is past the end of the {schema} event log "
                f"({len(rows)} events, positions 0..{len(rows) - 1})"
            )
    elif log_range.since is not None:
        start = next((i for i, r in enumerate(rows) if r["created_at"] >= log_range.since), len(rows))
        if start == len(rows):
            raise NotFound(
                f"no {schema} event recorded since {log_range.since.isoformat()}: "
                f"the log spans {first} .. {last}"
            )
    events = []
    for r in rows:
        envelope = envelope_pb2.Envelope()
        envelope.ParseFromString(r["envelope"])
        events.append(envelope)
    return events, start


async def replay_outbox(
    pg: Any,
    projection: EventProjection,
    log_range: OutboxRange,
    *,
    keep_scratch: bool = False,
    max_rows: int = 5,
) -> OutboxReplay:
    """Fold the log into `<schema>_replay_<hex>` and diff the rows the range touches with the live ones.

    One repeatable-read transaction reads the log and the live rows: a service writing meanwhile
    (a row and its event commit together) cannot make them disagree. Without `keep_scratch` the
    scratch schema is dropped in it; an error rolls all of it back.
    """
    async with pg.transaction(isolation="repeatable_read"):
        events, start = await read_log(pg, projection.schema, log_range.check())
        t0 = time.perf_counter()
        rows = projection.fold(events)
        touched = projection.fold(events[start:]) if start else rows
        replay_s = time.perf_counter() - t0
        scratch = f"{projection.schema}_replay_{uuid.uuid4().hex[:10]}"
        await pg.execute(f'CREATE SCHEMA "{scratch}"')
        diffs = [
            await _diff_table(pg, projection.schema, scratch, t, rows, touched, max_rows=max_rows)
            for t in projection.tables
        ]
        if not keep_scratch:
            await pg.execute(f'DROP SCHEMA "{scratch}" CASCADE')
    return OutboxReplay(schema=scratch, num_events=len(events) - start, replay_s=replay_s, diffs=diffs)


async def _diff_table(
    pg: Any,
    schema: str,
    scratch: str,
    t: TableProjection,
    rows: Mapping[str, Mapping[Row, Row]],
    touched: Mapping[str, Mapping[Row, Row]],
    *,
    max_rows: int,
) -> TableDiff:
    """COPY the replayed rows of the touched keys into the scratch table and compare with SQL."""
    cols, keys = ", ".join(t.columns), ", ".join(t.key)
    target = f'"{scratch}".{t.table}'
    await pg.execute(
        f'CREATE UNLOGGED TABLE {target} AS SELECT {cols} FROM "{schema}".{t.table} WITH NO DATA'
    )
    table_rows = rows.get(t.table, {})
    records = [table_rows[k] for k in touched.get(t.table, {}) if k in table_rows]
    await pg.copy_records_to_table(t.table, schema_name=scratch, records=records, columns=t.columns)
    replayed = f"SELECT {cols} FROM {target}"
    live = f'SELECT {cols} FROM "{schema}".{t.table} WHERE ({keys}) IN (SELECT {keys} FROM {target})'
    only_live = await pg.fetch(f"({live}) EXCEPT ({replayed}) ORDER BY 1 LIMIT {max_rows}")
    only_replayed = await pg.fetch(f"({replayed}) EXCEPT ({live}) ORDER BY 1 LIMIT {max_rows}")
    return TableDiff(
        table=t.table,
        num_live=await pg.fetchval(f"SELECT count(*) FROM ({live}) x"),
        num_replayed=len(records),
        only_live=[dict(r) for r in only_live],
        only_replayed=[dict(r) for r in only_replayed],
    )
