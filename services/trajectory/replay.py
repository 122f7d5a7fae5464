"""Load executions and replay them into samples; shared by StreamSamples and the CLI (shell).

Replay reads projections, not a folded tree: the trajectories rows pick the chains, the
tree_calls rows lay out the segments (layout.py), and only the calls owning a segment on a
selected path have their token blobs read and decompressed. An execution whose tree_calls rows
are missing (stored before that projection existed) is folded from the call log instead.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gyre.errors import Conflict, NotFound
from gyre.ids import require_uuid
from services.trajectory import repo
from services.trajectory.call_log import (
    CallLog,
    fill_from_row,
    load_call_shapes,
    load_chain_heads,
    load_payloads,
    raw_connection,
)
from services.trajectory.layout import (
    SelectedPath,
    TreeShape,
    calls_on_paths,
    covers,
    empty_buffers,
    select_paths,
    tree_shape,
)
from services.trajectory.tree import ExecutionTree
from services.trajectory.weights import (
    ExecutionReplay,
    Outcome,
    Sample,
    assemble_samples,
    group_advantages,
    tree_replay,
)

DECODE_THREADS = 2


async def resolve_executions(
    session: AsyncSession, execution_ids: Sequence[str], task_ids: Sequence[str]
) -> list[str]:
    """Named executions, then the executions of the named (ready) groups; each once, in order."""
    ordered = list(execution_ids)
    for i, task_id in enumerate(task_ids):
        require_uuid(f"task_ids[{i}]", task_id, what="a task")
        members = await repo.group_members(session, task_id)
        if members is None:
            raise NotFound(f"no group for task {task_id}")
        ready, ids = members
        if not ready:
            raise Conflict(f"group of task {task_id} is not ready: a reward or a recorded call is not in yet")
        ordered.extend(ids)
    return list(dict.fromkeys(ordered))


async def executions_with_calls(session: AsyncSession, execution_ids: Sequence[str]) -> list[str]:
    """The executions among `execution_ids` that have at least one recorded call, in order."""
    pg = await raw_connection(session)
    recorded = {
        r["execution_id"]
        for r in await pg.fetch(
            "SELECT execution_id FROM trajectory.executions WHERE execution_id = ANY($1) AND num_calls > 0",
            list(execution_ids),
        )
    }
    return [e for e in execution_ids if e in recorded]


async def load_trees(
    session: AsyncSession, calls: CallLog, execution_ids: Sequence[str]
) -> list[ExecutionTree]:
    pg = await raw_connection(session)
    headers = {
        r["execution_id"]: r["num_calls"]
        for r in await pg.fetch(
            "SELECT execution_id, num_calls FROM trajectory.executions WHERE execution_id = ANY($1)",
            list(execution_ids),
        )
    }
    missing = [e for e in execution_ids if not headers.get(e)]
    if missing:
        raise NotFound(f"no recorded calls for execution {', '.join(missing)}")
    return [await calls.tree(pg, e, num_calls=headers[e]) for e in execution_ids]


async def outcomes_for(
    session: AsyncSession, execution_ids: Sequence[str], estimator: str
) -> dict[str, Outcome]:
    known = await repo.load_outcomes(session, list(execution_ids))
    outcomes: dict[str, Outcome] = {}
    for e, k in known.items():
        advantage = 0.0
        if k.reward is not None and k.assessable and k.task_id:
            advantage = group_advantages(k.group_rewards, estimator=estimator).get(e, 0.0)
        outcomes[e] = Outcome(reward=k.reward, advantage=advantage, task_id=k.task_id)
    return outcomes


async def load_samples(
    session: AsyncSession,
    calls: CallLog,
    *,
    execution_ids: Sequence[str],
    task_ids: Sequence[str] = (),
    j_max: int,
    role_rank: Sequence[str],
    estimator: str,
    skip_without_calls: bool = False,
) -> list[Sample]:
    ids = await resolve_executions(session, execution_ids, task_ids)
    if not ids:
        raise NotFound("no executions named: give execution_ids or task_ids")
    # Infrastructure failures are kept out of the loss (and out of E in the 1/(E*U_e) weights):
    # their tokens say nothing about what the policy earned.
    excluded = await repo.unassessable_executions(session, ids)
    ids = [e for e in ids if e not in excluded]
    if not ids:
        return []
    if skip_without_calls or task_ids:
        # A ready group has every call its executions recorded stored (the proxy's count), so a
        # member without calls never made one: it yields no sample but counts in the baseline.
        named = set() if skip_without_calls else set(execution_ids)
        with_calls = set(await executions_with_calls(session, ids))
        ids = [e for e in ids if e in with_calls or e in named]
        if not ids:
            return []
    replays = await load_replays(session, calls, ids, j_max=j_max, role_rank=role_rank)
    outcomes = await outcomes_for(session, ids, estimator)
    return assemble_samples(replays, outcomes=outcomes)


async def load_replays(
    session: AsyncSession,
    calls: CallLog,
    execution_ids: Sequence[str],
    *,
    j_max: int,
    role_rank: Sequence[str],
) -> list[ExecutionReplay]:
    """Each execution's selected paths, with the tokens on them loaded (and nothing else)."""
    pg = await raw_connection(session)
    # Chains first: the shapes and blobs read after them cover at least every call they name.
    heads = await load_chain_heads(pg, execution_ids)
    missing = [e for e in execution_ids if not heads[e]]
    if missing:
        raise NotFound(f"no recorded calls for execution {', '.join(missing)}")
    shapes = await load_call_shapes(pg, execution_ids)
    plans: dict[str, tuple[TreeShape, list[SelectedPath]]] = {}
    folded: dict[str, ExecutionReplay] = {}
    for e in execution_ids:
        if not covers(shapes[e], heads[e]):
            (tree,) = await load_trees(session, calls, [e])
            folded[e] = tree_replay(tree, j_max=j_max, role_rank=role_rank)
            continue
        shape = tree_shape(shapes[e])
        plans[e] = (shape, select_paths(shape, heads[e], j_max=j_max, role_rank=role_rank))
    wanted = [(e, seq) for e, (shape, paths) in plans.items() for seq in calls_on_paths(shape, paths)]
    buffers = {e: empty_buffers(shape.n) for e, (shape, _) in plans.items()}
    rows = await load_payloads(pg, wanted)

    def fill(part: Sequence[Any]) -> None:
        for row in part:
            e = row["execution_id"]
            fill_from_row(buffers[e], plans[e][0], row)

    # zstd and numpy's copies release the GIL, and each call writes its own buffer range: two
    # threads decode in parallel where the machine has a core to spare.
    await asyncio.gather(*(asyncio.to_thread(fill, rows[i::DECODE_THREADS]) for i in range(DECODE_THREADS)))
    return [
        folded[e] if e in folded else ExecutionReplay(execution_id=e, buffers=buffers[e], paths=plans[e][1])
        for e in execution_ids
    ]
