"""The fault suite's second rig: the whole local stack, and faults no other rig can make (shell).

`gyre up` on embedded NATS and Postgres of its own (a temporary state folder, its own ports):
scheduler, runner, evaluator, proxy, trajectory, trainer, an engine per satellite cell and
every cell's agent with its warm training worker, and the stack's supervisor
(`gyre_app.supervise`), which brings a killed service back on its port by itself. Tasks are
the bundled `slugfix` repair task run by the built-in agent in the runner's sandboxes against
the tiny torch model, graded by the evaluator and trained by the trainer: nothing is played.

Each scenario submits groups, waits for the moment its fault matters (executions running for
the runner or an engine, an end being graded for the evaluator), kills one process with -9
(the supervisor restarts it) or stops and restarts NATS or Postgres for `OUTAGE_S`, then waits
for every group to be trained and checks, from the bus and the services' own answers: every
call the proxy recorded for an execution is in its tree exactly once; every execution ended
finished or timed out (not failed) and got exactly one reward; every group was trained exactly
once, none set aside; and every step's batch re-derives from the log to the checksum the
trainer recorded (`gyre replay step N`).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import message

from bench.fault_stack import read_events
from gyre.devstack.embedded import start_nats, start_postgres, stop_nats_in, stop_postgres
from gyre.devstack.processes import pid_running
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from gyre_app.client import GyreClient
from gyre_app.client.addresses import ServiceAddresses
from gyre_app.replay_step import replay_step
from gyre_app.stack import StackState, down, load_state, up

GROUPS, GROUP_SIZE = 2, 2
OUTAGE_S = 15.0
SETTLE_S = 300.0
AGENT_ENV = {"GYRE_AGENT_MAX_TOKENS": "96", "GYRE_AGENT_MAX_TURNS": "4"}


class LiveStack:
    def __init__(self, work: Path) -> None:
        self.kernel = KernelSettings(
            nats_url=None, database_url=None, bus_prefix="faults", state_dir=work / "stack"
        )
        self.state: StackState | None = None

    @property
    def state_dir(self) -> Path:
        return self.kernel.state_dir.resolve()

    async def start(self) -> None:
        self.state = await asyncio.to_thread(up, self.kernel, agent_env=AGENT_ENV, timeout_s=600.0)

    async def close(self) -> None:
        await asyncio.to_thread(down, self.kernel)

    def address(self, service: str) -> str:
        state = load_state(self.state_dir)
        assert state is not None
        return state.address_of(service)

    def pid(self, name: str) -> int:
        state = load_state(self.state_dir)
        assert state is not None
        return next(s.pid for s in state.services if s.name == name)

    async def events(self, service: str, cls: type[message.Message]) -> list[Any]:
        assert self.state is not None
        return await read_events(self.state.nats_url, self.kernel.bus_prefix, service, cls)

    async def submit(self) -> list[scheduler_pb2.Task]:
        spec = scheduler_pb2.TaskSpec(
            name="faults",
            family="repo_repair",
            prompt="Fix slug.slugify for repeated spaces and edge punctuation; keep tests/ passing.",
            group_size=GROUP_SIZE,
            timeout_s=180,
            harness="gyre-agent",
            workspace_template="task:slugfix",
        )
        request = scheduler_pb2.SubmitTasksRequest(
            request_id=f"faults-{uuid.uuid4().hex[:8]}", tasks=[spec] * GROUPS
        )
        for _ in range(600):  # bounded: the scheduler may be coming back from a fault
            try:
                async with grpc.aio.insecure_channel(self.address("scheduler")) as channel:
                    answer = await scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitTasks(
                        request, timeout=30
                    )
                return list(answer.tasks)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                await asyncio.sleep(0.5)
        raise RuntimeError("the scheduler never took the tasks")

    async def wait_for(
        self, classes: tuple[type[message.Message], ...], ids: set[str], timeout_s: float
    ) -> None:
        """Until one runner event of `classes` names one of these executions (the moment a fault
        matters)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for cls in classes:
                if any(e.execution.execution_id in ids for e in await self.events("runner", cls)):
                    return
            await asyncio.sleep(0.3)
        raise RuntimeError(f"no {classes[0].DESCRIPTOR.name} for the scenario's executions in {timeout_s} s")

    async def kill9(self, name: str, *, pid: int | None = None) -> None:
        os.kill(pid if pid is not None else self.pid(name), signal.SIGKILL)

    async def restart_server(self, which: str) -> None:
        """Stop the stack's own NATS or Postgres for `OUTAGE_S`, then start it on its port."""
        folder = self.state_dir / which
        if which == "nats":
            await asyncio.to_thread(stop_nats_in, folder)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(start_nats, folder)
        else:
            await asyncio.to_thread(stop_postgres, folder)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(start_postgres, folder)

    async def stored_calls(self, execution_id: str) -> list[str]:
        async with grpc.aio.insecure_channel(self.address("trajectory")) as channel:
            stub = trajectory_pb2_grpc.TrajectoryServiceStub(channel)
            try:
                tree = await stub.GetExecutionTree(
                    trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id), timeout=30
                )
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.NOT_FOUND:
                    return []
                raise
        return [c.call_id for c in tree.tree.calls]

    async def replay_mismatches(self, versions: list[int]) -> int:
        """Steps whose batch does not re-derive from the log to the recorded checksum."""
        addresses = ServiceAddresses(
            known={s: self.address(s) for s in ("scheduler", "runner", "trajectory", "trainer")}
        )
        bad = 0
        async with GyreClient(addresses, timeout_s=60.0) as client:
            for version in versions:
                bad += int(not (await replay_step(client, version)).matches)
        return bad

    async def settle(self, tasks: list[scheduler_pb2.Task]) -> dict[str, int]:
        """Wait for every group to be trained (or `SETTLE_S`), then count what went wrong."""
        task_ids = {t.task_id for t in tasks}
        executions = {e.execution_id for t in tasks for e in t.executions}
        deadline = time.monotonic() + SETTLE_S
        trained: dict[str, int] = {}
        while time.monotonic() < deadline:
            trained = await self.trained_counts()
            set_aside = {e.task_id for e in await self.events("trainer", trainer_events.GroupSetAside)}
            if all(trained.get(t, 0) or t in set_aside for t in task_ids):
                break
            await asyncio.sleep(1.0)
        set_aside = {e.task_id for e in await self.events("trainer", trainer_events.GroupSetAside)}
        rewards: dict[str, list[Any]] = {}
        for r in await self.events("evaluator", evaluator_events.RewardAssigned):
            rewards.setdefault(r.grade.execution_id, []).append(r)
        failed = {
            e.execution.execution_id
            for e in await self.events("runner", runner_events.ExecutionFailed)
            if e.execution.execution_id in executions
        }
        lost = duplicates = short = 0
        for eid in executions:
            if len(rewards.get(eid, [])) != 1 or not rewards[eid][0].HasField("num_calls_recorded"):
                short += 1
                continue
            recorded = rewards[eid][0].num_calls_recorded
            stored = await self.stored_calls(eid)
            lost += max(0, recorded - len(set(stored)))
            duplicates += len(stored) - len(set(stored)) + max(0, len(set(stored)) - recorded)
        return {
            "lost_calls": lost,
            "duplicate_calls": duplicates,
            "duplicate_trained_groups": sum(1 for t in task_ids if trained.get(t, 0) > 1),
            "unrecovered": short
            + len(failed)
            + sum(1 for t in task_ids if not trained.get(t, 0) or t in set_aside),
            "failed_executions": len(failed),
        }

    async def trained_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for step in await self.events("trainer", trainer_events.StepCompleted):
            for task_id in step.task_ids:
                counts[task_id] = counts.get(task_id, 0) + 1
        return counts

    def training_worker_pid(self, cell: str) -> int | None:
        """The warm training worker of a satellite cell (a child of its agent)."""
        agent = self.pid(cell)
        for child in Path(f"/proc/{agent}/task/{agent}/children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")
            if b"services.trainer.satellite" in cmdline and pid_running(int(child)):
                return int(child)
        return None


Moment = Callable[[LiveStack, set[str]], Awaitable[None]]
Fault = Callable[[LiveStack], Awaitable[None]]
ENDS = (runner_events.ExecutionFinished, runner_events.ExecutionTimedOut, runner_events.ExecutionFailed)


async def when_running(stack: LiveStack, ids: set[str]) -> None:
    await stack.wait_for((runner_events.ExecutionStarted,), ids, timeout_s=300.0)
    await asyncio.sleep(1.0)  # its harness is calling the model by now


async def when_grading(stack: LiveStack, ids: set[str]) -> None:
    await stack.wait_for(ENDS, ids, timeout_s=400.0)


async def at_once(stack: LiveStack, ids: set[str]) -> None:
    return None


async def kill_training_worker(stack: LiveStack) -> None:
    pid = stack.training_worker_pid("cell-1")
    if pid is None:
        raise RuntimeError("cell-1 has no training worker to kill")
    await stack.kill9("cell-1", pid=pid)


SCENARIOS: dict[str, tuple[Moment, Fault]] = {
    "kill_scheduler": (at_once, lambda s: s.kill9("scheduler")),
    "kill_runner": (when_running, lambda s: s.kill9("runner")),
    "kill_evaluator": (when_grading, lambda s: s.kill9("evaluator")),
    "kill_engine": (when_running, lambda s: s.kill9("engine-cell-1")),
    "kill_trainer_replica": (when_running, kill_training_worker),
    "restart_nats": (when_running, lambda s: s.restart_server("nats")),
    "restart_postgres": (when_running, lambda s: s.restart_server("postgres")),
}


async def run_rig(work: Path, only: tuple[str, ...] = ()) -> tuple[list[dict[str, Any]], int, int]:
    """Every scenario (or those in `only`) on one stack, in turn; returns their figures, how many
    steps were replayed from the log and how many of those missed their checksum."""
    stack = LiveStack(work)
    out: list[dict[str, Any]] = []
    try:
        await stack.start()
        for name, (moment, fault) in SCENARIOS.items():
            if only and name not in only:
                continue
            tasks = await stack.submit()
            await moment(stack, {e.execution_id for t in tasks for e in t.executions})
            faulted_at = time.monotonic()
            await fault(stack)
            figures = await stack.settle(tasks)
            out.append({"scenario": name, **figures, "recovery_s": round(time.monotonic() - faulted_at, 2)})
        versions = sorted(
            {s.version.steps for s in await stack.events("trainer", trainer_events.StepCompleted)}
        )
        mismatches = await stack.replay_mismatches(versions)
    finally:
        await stack.close()
    return out, len(versions), mismatches
