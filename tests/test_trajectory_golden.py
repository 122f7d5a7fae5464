"""Golden replay: a recorded call stream (tests/data) rebuilds the same trees and samples, in memory
and through Postgres (import, rebuild from the call log, replay)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from gyre.db.engine import make_engine, make_sessionmaker
from gyre_app.migrations import upgrade
from services.trajectory.call_log import CallLog, raw_connection, rebuild_projection
from services.trajectory.cli import ImportFailed, import_file, parse_lines, sample_json
from services.trajectory.projection import place_record
from services.trajectory.replay import load_samples
from services.trajectory.tree import ExecutionTree
from services.trajectory.weights import replay_batch

ASYNC = pytest.mark.asyncio(loop_scope="session")
DATA = Path(__file__).parent / "data"
STREAM = DATA / "trajectory_golden.jsonl"
EXPECTED = json.loads((DATA / "trajectory_golden_expected.json").read_text())
RANK = ("main", "sub", "summary")


def tree_summary(tree: ExecutionTree) -> dict[str, Any]:
    return {
        "unique_tokens": tree.n,
        "flat_tokens": tree.num_flat_tokens,
        "tokens": tree.tokens[: tree.n].tolist(),
        "chains": [
            [c.agent_role, c.agent_id, [tree.calls[s].call_id for s in c.call_seqs]] for c in tree.chains
        ],
    }


def in_memory() -> tuple[list[ExecutionTree], list[dict[str, Any]]]:
    trees: dict[str, ExecutionTree] = {}
    for _, record in parse_lines(STREAM):
        place_record(trees.setdefault(record.execution_id, ExecutionTree(record.execution_id)), record)
    ordered = [trees["golden-1"], trees["golden-2"]]
    samples = replay_batch(ordered, j_max=4, role_rank=RANK, outcomes={})
    return ordered, [sample_json(s) for s in samples]


def test_the_recorded_stream_rebuilds_the_golden_trees_and_samples() -> None:
    trees, samples = in_memory()
    assert [tree_summary(t) for t in trees] == EXPECTED["trees"]
    assert samples == EXPECTED["samples"]


@ASYNC
async def test_import_rebuild_and_replay_through_postgres_give_the_same_samples(database_url: str) -> None:
    await asyncio.to_thread(upgrade, "trajectory", database_url)
    first = await import_file(database_url, STREAM)
    again = await import_file(database_url, STREAM)
    assert (first["stored"], again["stored"], again["duplicates"]) == (8, 0, 8)
    engine = make_engine(database_url)
    try:
        sessions = make_sessionmaker(engine)
        async with sessions() as session, session.begin():
            pg = await raw_connection(session)
            rebuilt = [await rebuild_projection(pg, e) for e in ("golden-1", "golden-2")]
            rows = await pg.fetch(
                "SELECT execution_id, chain_index, agent_role, num_calls FROM trajectory.trajectories "
                "WHERE execution_id LIKE 'golden-%' ORDER BY 1, 2"
            )
        assert [tree_summary(t) for t in rebuilt] == EXPECTED["trees"]
        assert [(r["agent_role"], r["num_calls"]) for r in rows] == [
            (c[0], len(c[2])) for t in EXPECTED["trees"] for c in t["chains"]
        ]
        async with sessions() as session:
            samples = await load_samples(
                session,
                CallLog(),
                execution_ids=["golden-1", "golden-2"],
                j_max=4,
                role_rank=RANK,
                estimator="grpo",
            )
        assert [sample_json(s) for s in samples] == EXPECTED["samples"]
    finally:
        await engine.dispose()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("{not json", "2: not JSON"),
        (
            '{"execution_id": "g", "call_id": "x", "agent_role": "main", "prompt_ids": [1], '
            '"output_ids": [2, 3], "output_logprobs": [-1]}',
            "2: output_logprobs: has 1 entries, output_ids has 2",
        ),
    ],
)
def test_a_malformed_line_is_reported_with_its_number_and_reason(
    tmp_path: Path, line: str, reason: str
) -> None:
    path = tmp_path / "calls.jsonl"
    path.write_text(STREAM.read_text().splitlines()[0] + "\n" + line + "\n")
    with pytest.raises(ImportFailed, match=reason):
        parse_lines(path)


@ASYNC
async def test_an_import_whose_delta_names_an_unknown_parent_stores_nothing(
    database_url: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(upgrade, "trajectory", database_url)
    path = tmp_path / "calls.jsonl"
    good = json.loads(STREAM.read_text().splitlines()[0]) | {"execution_id": "golden-bad", "call_id": "b0"}
    bad = good | {
        "call_id": "b1",
        "prompt_delta": {"parent_call_id": "zz", "num_shared_tokens": 1, "new_ids": []},
    }
    del bad["prompt_ids"]
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ImportFailed, match=r"calls\.jsonl:2: prompt_delta\.parent_call_id: no call 'zz'"):
        await import_file(database_url, path)
    engine = make_engine(database_url)
    try:
        async with engine.connect() as conn:
            count = (
                await conn.exec_driver_sql(
                    "SELECT count(*) FROM trajectory.calls WHERE execution_id = 'golden-bad'"
                )
            ).scalar_one()
        assert count == 0
    finally:
        await engine.dispose()
