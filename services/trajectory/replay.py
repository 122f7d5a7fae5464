"""Load executions and replay them into samples; shared by StreamSamples and the CLI (shell)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncSession

from gyre.errors import Conflict, NotFound
from gyre.ids import require_uuid
from services.trajectory import repo
from services.trajectory.call_log import CallLog, raw_connection
from services.trajectory.tree import ExecutionTree
from services.trajectory.weights import Outcome, Sample, group_advantages, replay_batch


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
            raise Conflict(f"group of task {task_id} is not ready: not every execution has a reward")
        ordered.extend(ids)
    return list(dict.fromkeys(ordered))


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
        if k.reward is not None and k.task_id:
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
) -> list[Sample]:
    ids = await resolve_executions(session, execution_ids, task_ids)
    if not ids:
        raise NotFound("no executions named: give execution_ids or task_ids")
    trees = await load_trees(session, calls, ids)
    outcomes = await outcomes_for(session, ids, estimator)
    return replay_batch(trees, j_max=j_max, role_rank=role_rank, outcomes=outcomes)
