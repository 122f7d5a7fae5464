"""Replay from the stored tree shape (tree_calls projection) gives what a folded tree gives.

Tree tests use readable ids: context ids < 100, policy (generated) ids >= 100.
"""

from __future__ import annotations

import asyncio
import dataclasses
import zlib
from typing import Any

import numpy as np
import pytest

from gyre.db.engine import make_engine, make_sessionmaker
from gyre_app.migrations import upgrade
from services.trajectory.call_log import CallLog, raw_connection, rebuild_projection, shape_rows
from services.trajectory.codec import _planes, pack_arrays, unpack_arrays
from services.trajectory.layout import (
    ChainHead,
    call_shapes,
    calls_on_paths,
    empty_buffers,
    fill_call,
    path_spans,
    select_paths,
    tree_shape,
)
from services.trajectory.projection import StoredCall, place_record
from services.trajectory.replay import load_samples
from services.trajectory.synthetic import SyntheticConfig, generate_execution
from services.trajectory.tree import ExecutionTree
from services.trajectory.weights import ExecutionReplay, Sample, assemble_samples, replay_batch
from tests.test_trajectory_tree import call, delta, grow

ASYNC = pytest.mark.asyncio(loop_scope="session")
RANK = ("main", "sub", "summary")
SMALL = SyntheticConfig(
    seed=11, target_tokens=40_000, compaction_context_tokens=8_000, sub_agent_probability=0.2
)


def heads_of(tree: ExecutionTree) -> list[ChainHead]:
    return [
        ChainHead(
            index=c.index,
            agent_role=c.agent_role,
            agent_id=c.agent_id,
            first_seq=c.first_seq,
            last_seq=c.last_seq,
        )
        for c in tree.chains
    ]


def projected_samples(tree: ExecutionTree, rows: list[StoredCall], *, j_max: int) -> tuple[list[Sample], int]:
    """Replay as load_replays does, from the projection and only the blobs on selected paths."""
    shape = tree_shape(call_shapes(tree))
    paths = select_paths(shape, heads_of(tree), j_max=j_max, role_rank=RANK)
    buffers = empty_buffers(shape.n)
    needed = calls_on_paths(shape, paths)
    for seq in needed:
        row, k = rows[seq], rows[seq].num_shared_output
        fill_call(
            buffers,
            shape,
            seq,
            new_prompt_ids=row.new_prompt_ids,
            new_output_ids=row.new_output_ids,
            new_output_logprobs=row.output_logprobs[k:],
            new_output_versions=row.output_versions[k:],
        )
    replay = ExecutionReplay(execution_id=tree.execution_id, buffers=buffers, paths=paths)
    return assemble_samples([replay], outcomes={}), len(needed)


def as_lists(samples: list[Sample]) -> list[dict[str, object]]:
    return [
        {
            "id": s.trajectory_id,
            "tokens": s.token_ids.tolist(),
            "mask": s.loss_mask.tolist(),
            "weight": s.token_weight.tolist(),
            "logprobs": s.old_logprobs.tolist(),
            "versions": s.policy_versions.tolist(),
        }
        for s in samples
    ]


def test_the_shape_laid_out_from_the_projection_has_the_trees_segments_and_paths() -> None:
    tree = grow(
        call("c0", [1, 2, 3], [100, 101]),
        call("c1", delta("c0", 5, [4]), [102]),
        call("c2", [1, 2, 9], [103]),  # a retry forked at the second token
        call("s0", [1, 2, 3, 7], [110], role="sub", agent="s"),
        call("c3", delta("c1", 7, []), []),  # an empty call at the end of c1
    )
    shape = tree_shape(call_shapes(tree))
    assert (shape.seg_start, shape.seg_parent, shape.seg_owner) == (
        tree.seg_start,
        tree.seg_parent,
        tree.seg_owner,
    )
    assert shape.call_end == [c.end for c in tree.calls] and shape.n == tree.n
    for c in tree.calls:
        assert path_spans(shape, c.end) == tree.path_spans(c.end)
    assert path_spans(shape, tree.calls[1].end) == [(0, 3), (3, 5), (5, 6), (6, 7)]
    # c1's path runs through c0's segments and its own; c2 and s0 own nothing on it.
    paths = select_paths(shape, heads_of(tree)[:1], j_max=1, role_rank=RANK)
    assert calls_on_paths(shape, paths) == [0, 1]


def test_replay_from_the_projection_equals_replay_of_the_folded_tree_and_reads_fewer_blobs() -> None:
    tree = ExecutionTree("e1")
    rows = [place_record(tree, r) for r in generate_execution("e1", config=SMALL)]
    for j_max in (1, 3, 5):
        got, num_read = projected_samples(tree, rows, j_max=j_max)
        assert as_lists(got) == as_lists(replay_batch([tree], j_max=j_max, role_rank=RANK, outcomes={}))
        assert 0 < num_read < len(rows)


def test_a_blob_round_trips_and_a_zlib_blob_of_the_first_format_still_reads() -> None:
    ids = np.array([0, 1, 151_935, 7, 100], np.int32)
    logprobs = np.array([-0.25, -3.5, 0.0], np.float32)
    versions = np.array([3, 4, 2**40], np.int64)
    layout = [(np.int32, 5), (np.float32, 3), (np.int64, 3)]
    for blob in (
        pack_arrays([ids, logprobs, versions]),
        zlib.compress(_planes(ids) + _planes(logprobs) + _planes(versions)),
    ):
        got = unpack_arrays(blob, layout)
        assert [a.tolist() for a in got] == [ids.tolist(), logprobs.tolist(), versions.tolist()]
        assert [a.dtype for a in got] == [np.int32, np.float32, np.int64]


@ASYNC
async def test_ingest_stores_the_shape_rebuild_recomputes_it_and_replay_uses_it(database_url: str) -> None:
    await asyncio.to_thread(upgrade, "trajectory", database_url)
    records = {
        e: generate_execution(e, config=dataclasses.replace(SMALL, seed=seed))
        for e, seed in (("shape-1", 21), ("shape-2", 22))
    }
    engine = make_engine(database_url)
    try:
        sessions = make_sessionmaker(engine)
        for recs in records.values():
            for i in range(0, len(recs), 16):  # several ingest batches append to the projection
                async with sessions() as session, session.begin():
                    await CallLog().ingest(session, recs[i : i + 16])

        async def stored_shape(pg: Any, e: str) -> list[tuple[object, ...]]:
            rows = await pg.fetch(
                "SELECT execution_id, seq, chain_index, num_new_prompt, num_new_output, prompt_attach, "
                "output_attach FROM trajectory.tree_calls WHERE execution_id = $1 ORDER BY seq",
                e,
            )
            return [tuple(r) for r in rows]

        fresh = {}
        for e, recs in records.items():
            fresh[e] = ExecutionTree(e)
            for r in recs:
                place_record(fresh[e], r)
        async with sessions() as session, session.begin():
            pg = await raw_connection(session)
            for e in records:
                ingested = await stored_shape(pg, e)
                assert ingested == shape_rows(e, call_shapes(fresh[e]))
                rebuilt = await rebuild_projection(pg, e)
                assert await stored_shape(pg, e) == ingested
                assert [c.chain for c in rebuilt.calls] == [c.chain for c in fresh[e].calls]
        expected = as_lists(replay_batch(list(fresh.values()), j_max=3, role_rank=RANK, outcomes={}))

        async def replayed() -> list[dict[str, object]]:
            async with sessions() as session:
                got = await load_samples(
                    session, CallLog(), execution_ids=list(records), j_max=3, role_rank=RANK, estimator="grpo"
                )
            return as_lists(got)

        assert await replayed() == expected
        # Without its projection rows (stored before tree_calls existed) an execution is folded.
        async with sessions() as session, session.begin():
            pg = await raw_connection(session)
            await pg.execute("DELETE FROM trajectory.tree_calls WHERE execution_id = 'shape-2' AND seq >= 5")
        assert await replayed() == expected
        async with sessions() as session, session.begin():
            pg = await raw_connection(session)
            await rebuild_projection(pg, "shape-2")
            assert await stored_shape(pg, "shape-2") == shape_rows("shape-2", call_shapes(fresh["shape-2"]))
    finally:
        await engine.dispose()
