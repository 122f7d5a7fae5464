"""The fault suite's operator actions: what an operator does on purpose must fail nothing (shell).

    python -m bench.fault_operator --json                  # these scenarios alone
    python -m bench.faults --full --json                   # with every other scenario

On the whole local stack of `bench.fault_live` (its own embedded NATS and Postgres, the bundled
`slugfix` task run by the built-in agent, graded and trained for real), while a scenario's
executions run:

- `graceful_restart_<process>`: `gyre restart <process>` (SIGTERM, then the same port and
  settings) of every service and of one engine;
- `restart_from_empty_env`: `gyre restart runner` run as a command from an environment that holds
  nothing but PATH and the stack's state folder (not its bus prefix, not its settings).

After the action a fresh group is submitted; the scenario's groups and the fresh one must all be
trained within the rig's settle time. `operator_action_failures` counts the executions of these
scenarios that ended failed (ExecutionFailed): a graceful stop or restart should fail none.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench.fault_live import LiveStack, when_running
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.stack import REPO_ROOT, SERVICES
from gyre_app.stack_restart import restart

RESTARTED = (*SERVICES, "engine-cell-1")
"""Every service, and one satellite's engine, each restarted gracefully in turn."""


def graceful_restart(name: str) -> Callable[[LiveStack], Awaitable[None]]:
    async def action(stack: LiveStack) -> None:
        await asyncio.to_thread(restart, stack.kernel, name)

    return action


async def restart_from_empty_env(stack: LiveStack) -> None:
    bare = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GYRE_STATE_DIR": str(stack.state_dir)}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gyre_app.cli", "restart", "runner"],
        cwd=REPO_ROOT,
        env=bare,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"gyre restart runner from an empty environment failed: {done.stderr.strip()}")


def scenarios() -> dict[str, Callable[[LiveStack], Awaitable[None]]]:
    out = {f"graceful_restart_{name}": graceful_restart(name) for name in RESTARTED}
    out["restart_from_empty_env"] = restart_from_empty_env
    return out


async def run_scenarios(stack: LiveStack, only: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Each scenario on a started `stack`, in turn: its figures (fault_live's), the fresh group's
    included, and `operator_action_failures`."""
    out: list[dict[str, Any]] = []
    for name, action in scenarios().items():
        if only and name not in only:
            continue
        tasks = await stack.submit()
        await when_running(stack, {e.execution_id for t in tasks for e in t.executions})
        acted_at = time.monotonic()
        await action(stack)
        fresh = await stack.submit()  # after the action: training must go on
        figures = await stack.settle([*tasks, *fresh])
        out.append(
            {
                "scenario": name,
                **figures,
                "operator_action_failures": figures["failed_executions"],
                "recovery_s": round(time.monotonic() - acted_at, 2),
            }
        )
    return out


async def run_operator_rig(work: Path, only: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], int, int]:
    """These scenarios on a stack of their own; (figures, steps replayed, replay mismatches)."""
    stack = LiveStack(work)
    try:
        await stack.start()
        out = await run_scenarios(stack, only)
        versions = sorted(
            {s.version.steps for s in await stack.events("trainer", trainer_events.StepCompleted)}
        )
        mismatches = await stack.replay_mismatches(versions)
    finally:
        await stack.close()
    return out, len(versions), mismatches


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.fault_operator", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--only", action="append", default=[], help="run this scenario (repeatable)")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gyre-fault-operator-") as work:
        outcomes, steps, mismatches = asyncio.run(run_operator_rig(Path(work), tuple(ns.only)))
    figures = {
        "scenarios": len(outcomes),
        "operator_action_failures": sum(o["operator_action_failures"] for o in outcomes),
        "lost_calls": sum(o["lost_calls"] for o in outcomes),
        "duplicate_trained_groups": sum(o["duplicate_trained_groups"] for o in outcomes),
        "unrecovered": sum(o["unrecovered"] for o in outcomes),
        "recovery_s_max": max((o["recovery_s"] for o in outcomes), default=0.0),
        "steps_replayed": steps,
        "replay_mismatches": mismatches,
        "by_scenario": outcomes,
    }
    if not ns.json:
        for o in outcomes:
            print(o)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
