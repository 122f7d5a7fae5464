"""The append-only call log in Postgres and the in-memory trees folded from it (shell).

Ingest is batched: one transaction claims the event ids, locks the executions' header rows,
places every record in its tree (pure core), COPYs the new log rows and commits. Trees stay
cached after commit; a header row whose call count disagrees with the cached tree (another
process wrote, or a transaction failed) makes the tree reload from the log.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sqlalchemy as sa
import structlog
from sqlalchemy.ext.asyncio import AsyncSession

from gyre.errors import InvalidArgument
from services.trajectory.codec import Into, pack_arrays, unpack_arrays, unpack_into
from services.trajectory.layout import CallShapes, ChainHead, TokenBuffers, TreeShape, call_shapes
from services.trajectory.projection import StoredCall, build_tree, place_record
from services.trajectory.records import CallMeta, CallRecord
from services.trajectory.tree import ExecutionTree, ParentNotStored

log = structlog.get_logger(__name__)
S = "trajectory"
CALL_COLUMNS = (
    "execution_id",
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
    "policy_version",
    "uniform_versions",
    "payload",
    "engine_id",
    "num_migrations",
    "finish_reason",
    "started_at",
    "finished_at",
)
TRAJECTORY_COLUMNS = (
    "execution_id",
    "chain_index",
    "agent_role",
    "agent_id",
    "first_seq",
    "last_seq",
    "num_calls",
)
SHAPE_COLUMNS = (
    "execution_id",
    "seq",
    "chain_index",
    "num_new_prompt",
    "num_new_output",
    "prompt_attach",
    "output_attach",
)


@dataclass(slots=True, kw_only=True)
class IngestResult:
    stored: int = 0
    duplicates: int = 0
    new_tokens: int = 0
    rejected: dict[int, InvalidArgument] = field(default_factory=dict)
    """Index in the batch -> why the record was refused (nothing of it was written)."""


def to_row(s: StoredCall) -> tuple[Any, ...]:
    uniform = bool(len(s.output_versions) == 0 or np.all(s.output_versions == s.policy_version))
    arrays: list[np.ndarray] = [s.new_prompt_ids, s.new_output_ids, s.output_logprobs]
    if not uniform:
        arrays.append(s.output_versions)
    m = s.meta
    return (
        s.execution_id,
        s.seq,
        s.call_id,
        s.agent_role,
        s.agent_id,
        s.prompt_parent,
        s.num_shared_prompt,
        len(s.new_prompt_ids),
        s.output_parent,
        s.num_shared_output,
        s.output_len,
        s.policy_version,
        uniform,
        pack_arrays(arrays),
        m.engine_id,
        m.num_migrations,
        m.finish_reason,
        m.started_at,
        m.finished_at,
    )


def from_row(r: Any) -> StoredCall:
    n_out = r["num_output"]
    layout: list[tuple[Any, int]] = [
        (np.int32, r["num_new_prompt"]),
        (np.int32, n_out - r["num_shared_output"]),
        (np.float32, n_out),
    ]
    if not r["uniform_versions"]:
        layout.append((np.int64, n_out))
    arrays = unpack_arrays(r["payload"], layout)
    versions = arrays[3] if len(arrays) > 3 else np.full(n_out, r["policy_version"], np.int64)
    return StoredCall(
        execution_id=r["execution_id"],
        seq=r["seq"],
        call_id=r["call_id"],
        agent_role=r["agent_role"],
        agent_id=r["agent_id"],
        prompt_parent=r["prompt_parent"],
        num_shared_prompt=r["num_shared_prompt"],
        new_prompt_ids=arrays[0],  # type: ignore[arg-type]
        output_parent=r["output_parent"],
        num_shared_output=r["num_shared_output"],
        new_output_ids=arrays[1],  # type: ignore[arg-type]
        output_logprobs=arrays[2],  # type: ignore[arg-type]
        output_versions=versions,  # type: ignore[arg-type]
        policy_version=r["policy_version"],
        meta=CallMeta(
            engine_id=r["engine_id"],
            num_migrations=r["num_migrations"],
            finish_reason=r["finish_reason"],
            started_at=r["started_at"],
            finished_at=r["finished_at"],
        ),
    )


async def raw_connection(session: AsyncSession) -> Any:
    """The asyncpg connection under a session, inside its transaction (for COPY and bytea reads)."""
    conn = await session.connection()
    # SQLAlchemy's asyncpg adapter opens its transaction lazily, at the first statement it runs
    # itself: run one, or the raw statements below would each commit on their own.
    await conn.execute(sa.text("SELECT 1"))
    raw = await conn.get_raw_connection()
    pg = raw.driver_connection
    assert pg is not None and (pg.is_in_transaction() or not session.in_transaction())
    return pg


class CallLog:
    """Writes and reads the call log; keeps recently used execution trees in memory."""

    def __init__(self, *, cache_size: int = 32) -> None:
        self.cache: OrderedDict[str, ExecutionTree] = OrderedDict()
        self.cache_size = cache_size

    def _remember(self, tree: ExecutionTree) -> None:
        self.cache[tree.execution_id] = tree
        self.cache.move_to_end(tree.execution_id)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)

    async def load_rows(self, pg: Any, execution_id: str) -> list[StoredCall]:
        rows = await pg.fetch(
            f"SELECT {', '.join(CALL_COLUMNS)} FROM {S}.calls WHERE execution_id = $1 ORDER BY seq",
            execution_id,
        )
        return [from_row(r) for r in rows]

    async def tree(self, pg: Any, execution_id: str, *, num_calls: int | None = None) -> ExecutionTree:
        """The execution's tree from the cache when current, else folded from the log."""
        cached = self.cache.get(execution_id)
        if cached is not None and (num_calls is None or len(cached.calls) == num_calls):
            self.cache.move_to_end(execution_id)
            return cached
        tree = build_tree(execution_id, await self.load_rows(pg, execution_id))
        self._remember(tree)
        return tree

    async def ingest(self, session: AsyncSession, records: Sequence[CallRecord]) -> IngestResult:
        """Place and store a batch of records in the session's transaction (the caller commits).

        Calls already in the log (same `call_id`) are counted as duplicates and change nothing.
        If the transaction does not commit, call `forget` with the batch's executions.
        """
        result = IngestResult()
        pg = await raw_connection(session)
        wanted = list(range(len(records)))
        executions = sorted({records[i].execution_id for i in wanted})
        if not executions:
            return result
        await pg.execute(
            f"INSERT INTO {S}.executions (execution_id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING",
            executions,
        )
        headers = await pg.fetch(
            f"SELECT execution_id, num_calls FROM {S}.executions WHERE execution_id = ANY($1) "
            "ORDER BY execution_id FOR UPDATE",
            executions,
        )
        elsewhere = {
            r["call_id"]: r["execution_id"]
            for r in await pg.fetch(
                f"SELECT call_id, execution_id FROM {S}.calls WHERE call_id = ANY($1)",
                [records[i].call_id for i in wanted],
            )
        }
        trees = {
            h["execution_id"]: await self.tree(pg, h["execution_id"], num_calls=h["num_calls"])
            for h in headers
        }
        before = {e: (len(t.calls), t.n) for e, t in trees.items()}
        rows: list[tuple[Any, ...]] = []
        shapes: list[tuple[Any, ...]] = []
        # A delta may come before its parent in the same batch (redelivery reorders): passes
        # repeat while they place something, so such a child is stored with its parent.
        pending = wanted
        while pending:
            deferred: list[int] = []
            for i in pending:
                record = records[i]
                tree = trees[record.execution_id]
                if record.call_id in tree.call_seq:
                    result.duplicates += 1
                    continue
                if record.call_id in elsewhere:
                    result.rejected[i] = InvalidArgument(
                        "call_id",
                        f"{record.call_id} is already recorded for execution {elsewhere[record.call_id]}",
                    )
                    continue
                try:
                    stored = place_record(tree, record)
                except ParentNotStored as exc:
                    result.rejected[i] = exc
                    deferred.append(i)
                    continue
                except InvalidArgument as exc:
                    result.rejected[i] = exc
                    continue
                result.rejected.pop(i, None)
                rows.append(to_row(stored))
                placed = tree.calls[stored.seq]
                shapes.append(
                    (
                        tree.execution_id,
                        placed.seq,
                        placed.chain,
                        len(stored.new_prompt_ids),
                        len(stored.new_output_ids),
                        placed.prompt_attach,
                        placed.output_attach,
                    )
                )
            if len(deferred) == len(pending):
                break
            pending = deferred
        if rows:
            await pg.copy_records_to_table("calls", schema_name=S, records=rows, columns=CALL_COLUMNS)
            await pg.copy_records_to_table("tree_calls", schema_name=S, records=shapes, columns=SHAPE_COLUMNS)
        for execution_id, tree in trees.items():
            n_calls, n_tokens = before[execution_id]
            if len(tree.calls) == n_calls:
                continue
            result.new_tokens += tree.n - n_tokens
            await pg.execute(
                f"UPDATE {S}.executions SET num_calls = $2, num_unique_tokens = $3, num_flat_tokens = $4 "
                "WHERE execution_id = $1",
                execution_id,
                len(tree.calls),
                tree.n,
                tree.num_flat_tokens,
            )
            touched = {tree.calls[s].chain for s in range(n_calls, len(tree.calls))}
            await upsert_trajectories(pg, tree, sorted(touched))
        result.stored = len(rows)
        return result

    def forget(self, execution_ids: Sequence[str]) -> None:
        for e in execution_ids:
            self.cache.pop(e, None)


async def upsert_trajectories(pg: Any, tree: ExecutionTree, chain_indices: Sequence[int]) -> None:
    """Refresh the trajectories projection rows of the given chains."""
    if not chain_indices:
        return
    await pg.executemany(
        f"INSERT INTO {S}.trajectories ({', '.join(TRAJECTORY_COLUMNS)}) VALUES ($1, $2, $3, $4, $5, $6, $7) "
        "ON CONFLICT (execution_id, chain_index) "
        "DO UPDATE SET last_seq = excluded.last_seq, num_calls = excluded.num_calls",
        trajectory_rows(tree, chain_indices),
    )


def trajectory_rows(tree: ExecutionTree, chain_indices: Sequence[int]) -> list[tuple[Any, ...]]:
    """Rows of the trajectories projection (TRAJECTORY_COLUMNS) for the given chains."""
    chains = [tree.chains[i] for i in chain_indices]
    return [
        (tree.execution_id, c.index, c.agent_role, c.agent_id, c.first_seq, c.last_seq, len(c.call_seqs))
        for c in chains
    ]


async def rebuild_projection(pg: Any, execution_id: str) -> ExecutionTree:
    """Recompute one execution's trajectories projection and header from its call log."""
    tree = build_tree(execution_id, await CallLog().load_rows(pg, execution_id))
    await pg.execute(f"DELETE FROM {S}.trajectories WHERE execution_id = $1", execution_id)
    await upsert_trajectories(pg, tree, range(len(tree.chains)))
    await pg.execute(f"DELETE FROM {S}.tree_calls WHERE execution_id = $1", execution_id)
    await pg.copy_records_to_table(
        "tree_calls",
        schema_name=S,
        records=shape_rows(execution_id, call_shapes(tree)),
        columns=SHAPE_COLUMNS,
    )
    await pg.execute(
        f"INSERT INTO {S}.executions (execution_id, num_calls, num_unique_tokens, num_flat_tokens) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (execution_id) DO UPDATE SET num_calls = excluded.num_calls, "
        "num_unique_tokens = excluded.num_unique_tokens, num_flat_tokens = excluded.num_flat_tokens",
        execution_id,
        len(tree.calls),
        tree.n,
        tree.num_flat_tokens,
    )
    return tree


def shape_rows(execution_id: str, shapes: CallShapes) -> list[tuple[Any, ...]]:
    columns = (
        shapes.chain.tolist(),
        shapes.num_new_prompt.tolist(),
        shapes.num_new_output.tolist(),
        shapes.prompt_attach.tolist(),
        shapes.output_attach.tolist(),
    )
    return [(execution_id, seq, *row) for seq, row in enumerate(zip(*columns, strict=True))]


async def load_chain_heads(pg: Any, execution_ids: Sequence[str]) -> dict[str, list[ChainHead]]:
    """The trajectories projection of each execution, by chain index."""
    heads: dict[str, list[ChainHead]] = {e: [] for e in execution_ids}
    for r in await pg.fetch(
        f"SELECT execution_id, chain_index, agent_role, agent_id, first_seq, last_seq FROM {S}.trajectories "
        "WHERE execution_id = ANY($1) ORDER BY execution_id, chain_index",
        list(execution_ids),
    ):
        heads[r["execution_id"]].append(
            ChainHead(
                index=r["chain_index"],
                agent_role=r["agent_role"],
                agent_id=r["agent_id"],
                first_seq=r["first_seq"],
                last_seq=r["last_seq"],
            )
        )
    return heads


async def load_call_shapes(pg: Any, execution_ids: Sequence[str]) -> dict[str, CallShapes]:
    """The tree_calls projection of each execution (empty when it has no rows)."""
    rows = await pg.fetch(
        f"SELECT {', '.join(SHAPE_COLUMNS)} FROM {S}.tree_calls WHERE execution_id = ANY($1) "
        "ORDER BY execution_id, seq",
        list(execution_ids),
    )
    by_execution: dict[str, list[Any]] = {e: [] for e in execution_ids}
    for r in rows:
        by_execution[r[0]].append(r)
    return {e: _shapes(rs) for e, rs in by_execution.items()}


def _shapes(rows: Sequence[Any]) -> CallShapes:
    table = np.array([tuple(r)[1:] for r in rows], np.int64).reshape(len(rows), len(SHAPE_COLUMNS) - 1)
    seq, chain, new_prompt, new_output, prompt_attach, output_attach = table.T
    # A gap in seq (rows missing) keeps only the rows before it; `covers` then decides.
    gap = np.flatnonzero(seq != np.arange(len(seq)))
    k = int(gap[0]) if gap.size else len(seq)
    return CallShapes(
        num_new_prompt=new_prompt[:k],
        num_new_output=new_output[:k],
        prompt_attach=prompt_attach[:k],
        output_attach=output_attach[:k],
        chain=chain[:k],
    )


async def load_payloads(pg: Any, wanted: Sequence[tuple[str, int]]) -> list[Any]:
    """The log rows (counts and blob) of the given (execution_id, seq) pairs, for `fill_from_row`."""
    return list(
        await pg.fetch(
            "SELECT execution_id, seq, num_new_prompt, num_output, num_shared_output, policy_version, "
            f"uniform_versions, payload FROM {S}.calls WHERE (execution_id, seq) IN "
            "(SELECT * FROM unnest($1::text[], $2::int[]))",
            [e for e, _ in wanted],
            [s for _, s in wanted],
        )
    )


def fill_from_row(buffers: TokenBuffers, shape: TreeShape, r: Any) -> None:
    """Decode a log row's new tokens straight into the buffer where `tree_shape` put them.

    The same placement as `layout.fill_call` (as `fold_stored` appends), without temporaries.
    """
    seq, n_prompt, n_out, k = r["seq"], r["num_new_prompt"], r["num_output"], r["num_shared_output"]
    if n_prompt != shape.num_new_prompt[seq] or n_out - k != shape.num_new_output[seq]:
        raise ValueError(f"call {seq}: its log row disagrees with its tree_calls row")
    start = shape.call_start[seq]
    mid = start + n_prompt
    stop = mid + n_out - k
    layout: list[tuple[Any, int]] = [(np.int32, n_prompt), (np.int32, n_out - k), (np.float32, n_out)]
    into: list[Into | None] = [
        (buffers.tokens[start:mid], 0),
        (buffers.tokens[mid:stop], 0),
        (buffers.logprob[mid:stop], k),
    ]
    if r["uniform_versions"]:
        buffers.version[mid:stop] = r["policy_version"]
    else:
        layout.append((np.int64, n_out))
        into.append((buffers.version[mid:stop], k))
    unpack_into(r["payload"], layout, into)
    buffers.target[mid:stop] = True
