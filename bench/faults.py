"""Fault suite: break the live path mid-run and check that nothing is lost or done twice (shell).

    python -m bench.faults --json          # the reduced set CI runs (tests/test_faults.py)
    python -m bench.faults --full --json   # every scenario built so far

Each scenario runs groups of executions through the real proxy, trajectory service and trainer
(see `bench/fault_stack.py`), breaks something while they run, lets the stack recover, and
checks: every call answered to a harness is in its execution's tree, each exactly once, and the
tree holds exactly the calls the proxy counted (`lost_calls`, `duplicate_calls`); every group is
trained once (`duplicate_trained_groups`), and none is left untrained or short of calls
(`unrecovered`). `recovery_s` is the time from the fault to the scenario's last group trained.

Scenarios: `baseline` (no fault), `kill_proxy` and `kill_trajectory` (kill -9 mid-run, restart
on the same ports), `kill_trainer` (kill -9 while the groups become ready), `duplicated_events`
(every call, reward and task event sent again under new event ids), `reordered_events` (an
execution's calls published children first, rewards before the task); with `--full`, Postgres
away 20, 60 and 180 s and NATS away 60 s on the whole stack (`bench.fault_outages`), after each
of which fresh tasks must train (`wedged` counts those after which they did not). Not built yet (issue
18): kill -9 of the scheduler, runner, evaluator, an engine or a trainer replica, a NATS or
Postgres restart (shared servers on development machines), a cut proxy-engine link, a step's
batch rebuilt from the log. Uses GYRE_NATS_URL / GYRE_DATABASE_URL when set, else the embedded
servers; a fresh database and bus prefix, removed afterwards. Prints one JSON object last.
`--full` also runs the operator actions of `bench.fault_operator` (a graceful restart of every
service, `gyre restart` from an empty environment) and reports `operator_action_failures`.
`--full` adds the liveness scenarios (`bench.fault_liveness`; `wedged`: no fresh group trained).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench import fault_liveness
from bench.fault_stack import Execution, Stack
from bench.slice import servers
from gyre.common.v1 import ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2

GROUPS, GROUP_SIZE, TURNS = 2, 2, 3
SETTLE_S = 120.0
Fault = Callable[[Stack, list[Execution]], Awaitable[float]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    scenario: str
    lost_calls: int
    duplicate_calls: int
    duplicate_trained_groups: int
    unrecovered: int
    recovery_s: float
    failed_executions: int = 0
    """Executions that ended failed (not finished or timed out): counted in `unrecovered` too."""
    wedged: int = 0
    """1 when a fresh group after the scenario did not train within the bound (`fault_liveness`)."""


async def _after_answers(executions: list[Execution], n: int, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.05)):  # bounded
        if sum(len(e.answered) for e in executions) >= n:
            return
        await asyncio.sleep(0.05)


def cut_engine_link(*, when_answered: int, outage_s: float = 5.0) -> Fault:
    """Cut the proxy's link to its engine mid-run (calls in flight break), restore it later."""

    async def fault(stack: Stack, executions: list[Execution]) -> float:
        await _after_answers(executions, when_answered)
        assert stack.link is not None
        stack.link.cut()
        cut_at = time.monotonic()
        await asyncio.sleep(outage_s)
        stack.link.restore()
        return cut_at

    return fault


def kill_and_restart(name: str, *, when_answered: int) -> Fault:
    async def fault(stack: Stack, executions: list[Execution]) -> float:
        await _after_answers(executions, when_answered)
        stack.services[name].kill9()
        killed_at = time.monotonic()
        await stack.restart(name)
        return killed_at

    return fault


async def settle(stack: Stack, executions: list[Execution], tasks: list[str]) -> Outcome:
    """Wait for every group to be trained, then count what went wrong."""
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        trained = await stack.trained_counts()
        if all(trained.get(t, 0) for t in tasks):
            break
        await asyncio.sleep(0.5)
    trained = await stack.trained_counts()
    lost = duplicates = short = 0
    for e in executions:
        stored = await stack.stored_calls(e.execution_id)
        lost += len(set(e.answered) - set(stored))
        duplicates += len(stored) - len(set(stored)) + max(0, len(stored) - (e.num_recorded or 0))
        short += int(e.num_recorded is None or len(set(stored)) < e.num_recorded)
    return Outcome(
        scenario="",
        lost_calls=lost,
        duplicate_calls=duplicates,
        duplicate_trained_groups=sum(1 for t in tasks if trained.get(t, 0) > 1),
        unrecovered=short + sum(1 for t in tasks if not trained.get(t, 0)),
        recovery_s=0.0,
    )


async def run_live(
    stack: Stack, name: str, fault: Fault | None = None, *, fault_after_end: bool = False
) -> Outcome:
    """Groups of harnesses through the proxy; `fault` while they call (or once they all ended)."""
    executions = [e for _ in range(GROUPS) for e in await stack.submit_group(GROUP_SIZE)]
    tasks = sorted({e.task_id for e in executions})
    harnesses = [asyncio.create_task(stack.run_harness(e, turns=TURNS)) for e in executions]
    faulted_at = time.monotonic()
    if fault is not None and not fault_after_end:
        faulted_at = await fault(stack, executions)
    await asyncio.gather(*harnesses)
    for i, e in enumerate(executions):
        await stack.end(e, score=float(i % 2))
    if fault is not None and fault_after_end:
        faulted_at = await fault(stack, executions)
    outcome = await settle(stack, executions, tasks)
    return _named(outcome, name, time.monotonic() - faulted_at if fault else 0.0)


async def duplicated_events(stack: Stack) -> Outcome:
    """A run, then every task, call and reward event on the bus sent again as new events: no call
    may be stored twice, no group trained twice (checked over everything on the bus)."""
    started = time.monotonic()
    await run_live(stack, "duplicated_events")
    rewards = await stack.events("evaluator", evaluator_events.RewardAssigned)
    tasks = set()
    for event in await stack.events("scheduler", scheduler_events.TaskSubmitted):
        tasks.add(event.task.task_id)
        await stack.publish(event, "scheduler", event.task.task_id)
    for event in await stack.events("proxy", proxy_events.LlmCallRecorded):
        await stack.publish(event, "proxy", event.call.execution_id)
    for event in rewards:
        await stack.publish(event, "evaluator", event.grade.task_id)
    await asyncio.sleep(3.0)  # consumed by now; a second step would have started
    executions = [
        Execution(
            execution_id=r.grade.execution_id,
            task_id=r.grade.task_id,
            token="",
            num_recorded=r.num_calls_recorded,
        )
        for r in rewards
    ]
    return _named(
        await settle(stack, executions, sorted(tasks)), "duplicated_events", time.monotonic() - started
    )


async def reordered_events(stack: Stack) -> Outcome:
    """Copies of recorded executions whose calls come children first, rewards before their task."""
    started = time.monotonic()
    calls = await stack.events("proxy", proxy_events.LlmCallRecorded)
    by_execution: dict[str, dict[str, proxy_events.LlmCallRecorded]] = {}
    for event in calls:  # once per call: `duplicated_events` sent each call twice
        by_execution.setdefault(event.call.execution_id, {}).setdefault(event.call.call_id, event)
    originals = [e for e, records in by_execution.items() if len(records) >= TURNS][: GROUPS * GROUP_SIZE]
    task_id = str(uuid.uuid4())
    copies = [Execution(execution_id=str(uuid.uuid4()), task_id=task_id, token="") for _ in originals]
    for i, (original, copy) in enumerate(zip(originals, copies, strict=True)):
        records = list(by_execution[original].values())
        renamed = {r.call.call_id: str(uuid.uuid4()) for r in records}
        copy.num_recorded = len(records)
        copy.answered = list(renamed.values())
        grade = evaluator_pb2.Grade(
            execution_id=copy.execution_id, task_id=task_id, score=float(i % 2), assessable=True
        )
        await stack.publish(
            evaluator_events.RewardAssigned(grade=grade, num_calls_recorded=len(records)),
            "evaluator",
            task_id,
        )
        for event in reversed(records):
            moved = proxy_events.LlmCallRecorded()
            moved.CopyFrom(event)
            moved.call.execution_id, moved.call.call_id = copy.execution_id, renamed[event.call.call_id]
            if moved.call.HasField("prompt_delta"):
                moved.call.prompt_delta.parent_call_id = renamed[event.call.prompt_delta.parent_call_id]
            await stack.publish(moved, "proxy", copy.execution_id)
    task = scheduler_pb2.Task(
        task_id=task_id,
        spec=scheduler_pb2.TaskSpec(family="terminal", group_size=len(copies)),
        executions=[
            ids_pb2.ExecutionRef(task_id=task_id, execution_id=c.execution_id, index_in_group=i)
            for i, c in enumerate(copies)
        ],
    )
    await stack.publish(scheduler_events.TaskSubmitted(task=task), "scheduler", task_id)
    return _named(await settle(stack, copies, [task_id]), "reordered_events", time.monotonic() - started)


def _named(outcome: Outcome, name: str, recovery_s: float) -> Outcome:
    return Outcome(**{**asdict(outcome), "scenario": name, "recovery_s": round(recovery_s, 2)})


async def run(*, full: bool, urls: tuple[str, str] | None = None) -> dict[str, object]:
    """Every scenario of the set on (NATS URL, Postgres admin URL); the figures `--json` prints.
    `full` adds the last roled scenarios and the whole-stack rig (`bench.fault_live`), which runs
    on embedded servers of its own (it restarts them)."""
    nats_url, admin_url = urls or servers()
    outcomes: list[Outcome] = []
    steps = mismatches = operator_failures = 0
    with tempfile.TemporaryDirectory(prefix="gyre-faults-") as work:
        async with scratch_kernel(nats_url, admin_url, label="faults") as kernel:
            stack = Stack(kernel, Path(work))
            try:
                await stack.start()
                outcomes.append(await run_live(stack, "baseline"))
                outcomes.append(
                    await run_live(stack, "kill_proxy", kill_and_restart("proxy", when_answered=3))
                )
                outcomes.append(
                    await run_live(stack, "kill_trajectory", kill_and_restart("trajectory", when_answered=3))
                )
                outcomes.append(await duplicated_events(stack))
                outcomes.append(await reordered_events(stack))
                if full:
                    trainer_fault = kill_and_restart("trainer", when_answered=0)
                    outcomes.append(
                        await run_live(stack, "kill_trainer", trainer_fault, fault_after_end=True)
                    )
                    outcomes.append(
                        await run_live(stack, "cut_engine_link", cut_engine_link(when_answered=3))
                    )
                    outcomes.append(Outcome(**await fault_liveness.long_trajectory(stack)))
                steps, mismatches = await stack.replay_steps()
            finally:
                await stack.close()
        if full:
            from bench.fault_live import run_rig

            live, live_steps, live_mismatches = await run_rig(Path(work) / "live")
            outcomes += [Outcome(**o) for o in live]
            outcomes += [Outcome(**o) for o in await fault_liveness.run_liveness_rig(Path(work) / "liveness")]
            steps += live_steps
            mismatches += live_mismatches
            from bench.fault_operator import run_operator_rig

            operator, operator_steps, operator_mismatches = await run_operator_rig(Path(work) / "operator")
            operator_failures = sum(o.pop("operator_action_failures") for o in operator)
            outcomes += [Outcome(**o) for o in operator]
            steps += operator_steps
            mismatches += operator_mismatches
            from bench.fault_outages import run_outages

            away, _ = await run_outages(Path(work) / "outages")
            outcomes += [Outcome(**o) for o in away]  # each carries its own `wedged`
    return {
        "scenarios": len(outcomes),
        "lost_calls": sum(o.lost_calls for o in outcomes),
        "duplicate_calls": sum(o.duplicate_calls for o in outcomes),
        "duplicate_trained_groups": sum(o.duplicate_trained_groups for o in outcomes),
        "unrecovered": sum(o.unrecovered for o in outcomes),
        "operator_action_failures": operator_failures,
        "wedged": sum(o.wedged for o in outcomes),
        "recovery_s_max": max(o.recovery_s for o in outcomes),
        "steps_replayed": steps,
        "replay_mismatches": mismatches,
        "by_scenario": [asdict(o) for o in outcomes],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="every scenario built, not only the CI set")
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    figures = asyncio.run(run(full=ns.full))
    if not ns.json:
        for o in figures["by_scenario"]:  # type: ignore[attr-defined]
            print(o)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
