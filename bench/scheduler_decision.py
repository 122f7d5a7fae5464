"""Benchmark of one live scheduling decision at cluster scale (shell).

    python -m bench.scheduler_decision --json [--cells 256] [--executions 4000] [--history-steps 16]

A scratch scheduler database (real Postgres, the scheduler's own migrations) is filled with a
synthetic run in progress: `--cells` cells (one core, the rest satellites: half serving, half
training), `--executions` executions running in groups of `--group-size`, a step's worth of
graded groups waiting, a queue of tasks not admitted yet, and `--history-steps` steps of groups
already trained (the history a long run piles up). Then the decision the live driver makes
every tick is timed, as it makes it: read the cluster, the cells and the facts from the tables
(`live_facts.load_facts`), build the view, call the policy. Figures, over `--repeats`
decisions: `decision_ms` p50 / p99 (the whole read and decision), `facts_read_and_fold_ms`
p50 / p99 (`load_facts` alone: the queries and the fold) and `policy_ms_p99` per mode (the pure
decision on the view). Uses GYRE_DATABASE_URL when set, else the embedded server; the database
is dropped afterwards. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession

from bench.slice import pct, servers
from gyre.db.engine import make_engine, make_sessionmaker
from gyre.devstack.scratch import scratch_kernel
from gyre.runtime import connect
from services.scheduler import repo
from services.scheduler.live_facts import load_cluster, load_facts
from services.scheduler.live_policy import policy_for
from services.scheduler.main import MIGRATIONS
from services.scheduler.policy.state import PolicyConfig

MODES = ("gyre", "async", "async_streaming", "colocate", "burst")
SLOTS = 16


def _task(seq: int, state: str, *, group_size: int, admitted: int | None, step: int | None) -> dict[str, Any]:
    now = datetime.now(UTC)
    return {
        "task_id": uuid.uuid4(),
        "request_id": f"bench-{seq}",
        "name": f"task-{seq}",
        "family": "bench",
        "prompt": "p",
        "group_size": group_size,
        "timeout_s": 3600.0,
        "harness": "bench",
        "workspace_template": "",
        "labels": {},
        "state": state,
        "submitted_at": now,
        "admitted_version": admitted,
        "assigned_step": step,
        "trained_version": step if state == "trained" else None,
        "max_infra_retries": 0,
        "harness_env": {},
    }


async def fill(session: AsyncSession, ns: argparse.Namespace) -> None:
    """The synthetic run: history, running groups, graded groups, the queue; version = history."""
    g, version = ns.group_size, ns.history_steps
    per_step = max(1, ns.executions // g // 2)  # B: two steps' groups run at once
    tasks: list[dict[str, Any]] = []
    states: list[str] = []
    for step in range(ns.history_steps):
        for _ in range(per_step):
            tasks.append(_task(len(tasks), "trained", group_size=g, admitted=max(0, step - 1), step=step))
            states.append("graded")
    for _ in range(ns.executions // g):
        tasks.append(_task(len(tasks), "running", group_size=g, admitted=version, step=None))
        states.append("running")
    for _ in range(per_step // 2):
        tasks.append(_task(len(tasks), "graded", group_size=g, admitted=version, step=version))
        states.append("graded")
    for _ in range(per_step * 2):
        tasks.append(_task(len(tasks), "queued", group_size=g, admitted=None, step=None))
        states.append("")
    for i in range(0, len(tasks), 2000):
        await session.execute(sa.insert(repo.tasks), tasks[i : i + 2000])
    executions = [
        {
            "execution_id": uuid.uuid4(),
            "task_id": task["task_id"],
            "index_in_group": k,
            "state": state,
            "duration_s": 600.0 if state == "graded" else None,
        }
        for task, state in zip(tasks, states, strict=True)
        if state
        for k in range(g)
    ]
    for i in range(0, len(executions), 4000):
        await session.execute(sa.insert(repo.executions), executions[i : i + 4000])
    now = datetime.now(UTC)
    cells = [
        {
            "cell_id": f"cell-{i:04d}",
            "role": "training" if i == 0 or i % 2 == 0 else "rollout",
            "target_role": "",
            "core": i == 0,
            "slots": SLOTS,
            "model_fingerprint": "",
            "engine_id": f"engine-{i}",
            "engine_address": "127.0.0.1:1",
            "agent_address": "127.0.0.1:1",
            "last_heartbeat_at": now,
            "registered_at": now,
        }
        for i in range(ns.cells)
    ]
    await session.execute(sa.insert(repo.cells), cells)
    await repo.load_cluster(session, default_mode="gyre")
    await session.execute(
        sa.update(repo.cluster)
        .where(repo.cluster.c.id == 1)
        .values(
            version=version,
            version_at=now,
            trained_groups=per_step * ns.history_steps,
            trained_tokens=per_step * ns.history_steps * 20_000,
            training_cell_s=per_step * ns.history_steps * 10.0,
        )
    )


def _config(num_cells: int, total_groups: int, group_size: int, tokens_per_s: float) -> PolicyConfig:
    return PolicyConfig(
        num_cells=num_cells,
        slots_per_cell=SLOTS,
        groups_per_step=256,
        group_size=group_size,
        max_staleness=2,
        total_groups=total_groups,
        step_overhead_s=60.0,
        rollout_to_training_s=8.5,
        training_to_rollout_s=3.5,
        tokens_per_s_per_cell=tokens_per_s,
    )


async def measure(database_url: str, ns: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    try:
        async with sessions() as session, session.begin():
            await fill(session, ns)
        decision_ms: list[float] = []
        fold_ms: list[float] = []
        policy_ms: dict[str, list[float]] = {m: [] for m in MODES}
        running = 0
        for _ in range(ns.repeats):
            started = time.perf_counter()
            async with sessions() as session, session.begin():
                cluster = await load_cluster(session, default_mode="gyre")
                cells = [c for c, _ in await repo.load_cells(session)]
                read = time.perf_counter()
                facts, _ = await load_facts(
                    session,
                    cluster=cluster,
                    cells=cells,
                    slots_per_cell=SLOTS,
                    tokens_per_group=cluster.tokens_per_group(guess=20_000),
                    tokens_per_s_per_cell=cluster.tokens_per_s_per_cell(guess=2000.0),
                )
                folded = time.perf_counter()
            config = _config(len(cells), facts.total_groups, facts.group_size, facts.tokens_per_s_per_cell)
            view = facts.view(time.time())
            policy_for("gyre", config)(view)
            decision_ms.append((time.perf_counter() - started) * 1000)
            fold_ms.append((folded - read) * 1000)
            running = view.running
            for mode in MODES:
                decide = policy_for(mode, config)  # type: ignore[arg-type]
                t0 = time.perf_counter()
                decide(view)
                policy_ms[mode].append((time.perf_counter() - t0) * 1000)
        return {
            "cells": ns.cells,
            "running_executions": running,
            "history_steps": ns.history_steps,
            "repeats": ns.repeats,
            "decision_ms_p50": round(pct(decision_ms, 0.5), 2),
            "decision_ms_p99": round(pct(decision_ms, 0.99), 2),
            "facts_read_and_fold_ms_p50": round(pct(fold_ms, 0.5), 2),
            "facts_read_and_fold_ms_p99": round(pct(fold_ms, 0.99), 2),
            "policy_ms_p99": {m: round(pct(v, 0.99), 3) for m, v in policy_ms.items()},
        }
    finally:
        await engine.dispose()


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    nats_url, database_url = servers()
    async with scratch_kernel(nats_url, database_url, label="decision") as kernel:
        conns = await connect(kernel, service="scheduler", migrations=MIGRATIONS)
        await conns.close()
        assert kernel.database_url is not None
        return await measure(kernel.database_url, ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cells", type=int, default=256)
    parser.add_argument("--executions", type=int, default=4000, help="executions running at once")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--history-steps", type=int, default=16, help="steps of groups already trained")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    for name in ("cells", "executions", "group_size", "repeats"):
        if getattr(ns, name) < 1 or ns.history_steps < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 1 (--history-steps >= 0)")
    out = asyncio.run(main_async(ns))
    if not ns.json:
        print(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
