"""Fault scenarios in which Postgres or NATS is away for a while: outages are waits (shell).

Two rigs. `postgres_away_while_rewards_land` runs on the suite's small rig (`bench.fault_stack`:
the real proxy, trajectory service and trainer) over a Postgres the caller started and may stop:
a group's rewards are published while the database is away, and the scenario counts whether the
group is trained once after it returns (tests/test_outage_wait_live.py runs it with a 25 s
outage, longer than the 15 s of handler retries after which a consumer used to dead-letter).

`run_outages` runs on the whole local stack (`bench.fault_live.LiveStack`: `gyre up` on its
own embedded servers) and makes the outages of issue 29: Postgres away 20, 60 and 180 s and
NATS away 60 s, each while the scenario's executions run, so their ends, grades, rewards and
steps all fall into the outage. After each it counts what `bench.fault_live` counts, then
submits fresh tasks: a scenario after which they are not trained within `FRESH_TRAIN_S` is
`wedged`.

    python -m bench.fault_outages --json                       # the four outages alone
    python -m bench.fault_outages --only nats_away_60s --json  # one of them
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.fault_live import LiveStack, when_running
from bench.fault_stack import Execution, Stack
from gyre.devstack.embedded import start_nats, start_postgres, stop_nats_in, stop_postgres

GROUP_SIZE, TURNS = 2, 2
FRESH_TRAIN_S = 300.0
"""How long fresh tasks submitted after a scenario may take to train before it counts as wedged."""
OUTAGES: tuple[tuple[str, str, float], ...] = (
    ("postgres_away_20s", "postgres", 20.0),
    ("postgres_away_60s", "postgres", 60.0),
    ("postgres_away_180s", "postgres", 180.0),
    ("nats_away_60s", "nats", 60.0),
)


async def postgres_away_while_rewards_land(
    stack: Stack, postgres_dir: Path, *, outage_s: float
) -> tuple[list[Execution], list[str]]:
    """One group runs and is revoked with Postgres up; its rewards are published while the
    database is away for `outage_s`; returns the executions and task to settle on (the caller
    settles, with `bench.faults.settle`)."""
    executions = await stack.submit_group(GROUP_SIZE)
    await asyncio.gather(*(stack.run_harness(e, turns=TURNS) for e in executions))
    for e in executions:
        await stack.revoke(e)
    await asyncio.to_thread(stop_postgres, postgres_dir)
    try:
        for i, e in enumerate(executions):
            await stack.reward(e, score=float(i % 2))
        await asyncio.sleep(outage_s)
    finally:
        await asyncio.to_thread(start_postgres, postgres_dir)
    return executions, [executions[0].task_id]


async def server_away(stack: LiveStack, which: str, outage_s: float) -> None:
    """Stop the whole stack's own NATS or Postgres, and start it again on its port `outage_s` later."""
    folder = stack.state_dir / which
    await asyncio.to_thread(stop_nats_in if which == "nats" else stop_postgres, folder)
    await asyncio.sleep(outage_s)
    await asyncio.to_thread(start_nats if which == "nats" else start_postgres, folder)


async def fresh_tasks_train(stack: LiveStack, *, within_s: float = FRESH_TRAIN_S) -> bool:
    """Whether tasks submitted now are all trained within `within_s` (training still advances)."""
    task_ids = {t.task_id for t in await stack.submit()}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        trained = await stack.trained_counts()
        if all(trained.get(t, 0) for t in task_ids):
            return True
        await asyncio.sleep(2.0)
    return False


async def run_outages(work: Path, only: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], int]:
    """Every outage scenario (or those named in `only`) on one whole stack, in turn; returns their
    figures (as `bench.fault_live.run_rig` does) and how many left training wedged."""
    stack = LiveStack(work)
    out: list[dict[str, Any]] = []
    wedged = 0
    try:
        await stack.start()
        for name, which, outage_s in OUTAGES:
            if only and name not in only:
                continue
            tasks = await stack.submit()
            await when_running(stack, {e.execution_id for t in tasks for e in t.executions})
            faulted_at = time.monotonic()
            await server_away(stack, which, outage_s)
            figures = await stack.settle(tasks)
            recovery_s = round(time.monotonic() - faulted_at, 2)  # the outage included, as in the suite
            advances = await fresh_tasks_train(stack)
            wedged += int(not advances)
            out.append({"scenario": name, **figures, "recovery_s": recovery_s, "wedged": int(not advances)})
    finally:
        await stack.close()
    return out, wedged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fault_outages", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", nargs="*", default=[], help="scenario names (default: all)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (the stack's logs)")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gyre-outages-") as scratch:
        work = ns.keep or Path(scratch)
        outcomes, wedged = asyncio.run(run_outages(work, tuple(ns.only)))
    if not ns.json:
        for o in outcomes:
            print(o)
    print(json.dumps({"scenarios": len(outcomes), "wedged": wedged, "by_scenario": outcomes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
