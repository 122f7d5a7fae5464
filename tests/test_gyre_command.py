"""The `gyre` command against real services (scheduler, runner, trajectory, trainer in-process on
real NATS and Postgres), run as users run it: `python -m gyre_app.cli ...` in a subprocess.

The runner runs the built-in agent in its sandbox against a scripted model (the model provider
is the external boundary; no proxy or engine here), so the test itself records each execution's
model calls and rewards, as the proxy and the evaluator would."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
import pytest_asyncio
from trainer_stack import connect_bus, eventually, fresh_kernel, start_trainer, submit_group

from bench.scripted_model import ScriptedModel
from gyre.bus import Bus
from gyre.db.engine import libpq_url
from gyre.db.outbox_replay import OutboxRange, replay_outbox
from gyre.errors import InvalidArgument
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from gyre_app.client import GyreClient, ServiceAddresses, TaskProgress
from gyre_app.replay_services import check_service, projection_of
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.scheduler.sim.workload import load_workload
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parents[1]
TASK = {"name": "add", "family": "terminal", "prompt": "2+2?", "group_size": 2, "timeout_s": 60}
SLEEPY = {**TASK, "name": "sleepy", "prompt": "[script: sleep] wait"}
SCRIPTS = {"sleep": {"main": [{"tool": "shell", "args": {"command": "sleep 60"}}]}}
ENDED = (
    runner_pb2.EXECUTION_STATE_FINISHED,
    runner_pb2.EXECUTION_STATE_FAILED,
    runner_pb2.EXECUTION_STATE_TIMED_OUT,
)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Stack:
    env: dict[str, str]
    scheduler: Any
    runner: Any
    trainer: Any
    trajectory_address: str
    bus: Bus
    tmp: Path
    database_url: str

    async def gyre(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gyre_app.cli", *args,
            cwd=REPO, env=env or self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def gyre_json(self, *args: str, env: dict[str, str] | None = None) -> Any:
        rc, out, err = await self.gyre(*args, "--json", env=env)
        assert rc == 0, err
        return json.loads(out.strip().splitlines()[-1])

    async def submit(self, spec: dict[str, Any] = TASK) -> scheduler_pb2.Task:
        request = scheduler_pb2.SubmitTasksRequest(
            request_id=f"t-{uuid.uuid4().hex[:8]}",
            tasks=[scheduler_pb2.TaskSpec(harness="gyre-agent", **spec)],
        )
        return (await self.scheduler.SubmitTasks(request)).tasks[0]  # type: ignore[no-any-return]

    async def execution_in(self, execution_id: str, states: tuple[int, ...]) -> None:
        async def reached() -> bool:
            request = runner_pb2.GetExecutionRequest(execution_id=execution_id)
            try:
                state = (await self.runner.GetExecution(request)).execution.state
            except grpc.aio.AioRpcError as err:  # scheduled, not yet consumed by the runner
                assert err.code() == grpc.StatusCode.NOT_FOUND, err
                return False
            return state in states

        await eventually(reached, timeout_s=60, what=f"execution {execution_id} in {states}")

    async def step_done(self, version: int) -> None:
        async def done() -> bool:
            status = await self.trainer.GetStatus(trainer_pb2.GetStatusRequest())
            return int(status.version.steps) >= version

        await eventually(done, timeout_s=60, what=f"step {version}")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def stack(
    server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    tmp = tmp_path_factory.mktemp("gyre-command")
    model = ScriptedModel(script={"main": [{"final": "4"}]}, scripts=SCRIPTS)
    runner_settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
        proxy_base_url=model.start(),
        memory_mb=1024,
        max_procs=64,
        disk_mb=64,
        file_size_mb=16,
        cpu_s=60,
    )
    async with fresh_kernel(*server_urls) as kernel:
        # The trainer first: building its torch model holds the GIL for seconds, which on a busy
        # machine starves the other services' NATS requests past their time-out.
        trajectory_port = closed_port()
        trainer = await start_trainer(kernel, f"127.0.0.1:{trajectory_port}", tmp / "trainer")
        scheduler = await build_scheduler(SchedulerSettings(port=0, admission="at_submit"), kernel)
        trajectory = await build_trajectory(TrajectorySettings(port=trajectory_port), kernel)
        runner, supervisor = await build_with_supervisor(runner_settings, kernel)
        await scheduler.start()
        await trajectory.start()
        await runner.start()
        bus = await connect_bus(kernel)
        channels = [grpc.aio.insecure_channel(h.address) for h in (scheduler, runner, trainer)]
        env = {
            **os.environ,
            "GYRE_STATE_DIR": str(tmp / "no-stack"),
            "GYRE_SCHEDULER_ADDRESS": scheduler.address,
            "GYRE_TRAJECTORY_ADDRESS": trajectory.address,
            "GYRE_TRAINER_ADDRESS": trainer.address,
            "GYRE_RUNNER_ADDRESS": runner.address,
            "GYRE_EVALUATOR_ADDRESS": f"127.0.0.1:{closed_port()}",
        }
        try:
            yield Stack(
                env=env,
                scheduler=scheduler_pb2_grpc.SchedulerServiceStub(channels[0]),
                runner=runner_pb2_grpc.RunnerServiceStub(channels[1]),
                trainer=trainer_pb2_grpc.TrainerServiceStub(channels[2]),
                trajectory_address=trajectory.address,
                bus=bus,
                tmp=tmp,
                database_url=kernel.database_url or "",
            )
        finally:
            for channel in channels:
                await channel.close()
            await bus.close()
            await trainer.stop()
            await runner.stop()
            supervisor.host.sweep()
            supervisor.host.root.rmdir()
            await trajectory.stop()
            await scheduler.stop()
            model.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def two_steps(stack: Stack) -> list[scheduler_pb2.Task]:
    """Two groups the scheduler accepted and the runner ran, trained as steps 1 and 2; both generated
    by version 0, so step 2 (trainer at version 1) trains samples 1 version stale."""
    tasks = []
    for version in (1, 2):
        task = await stack.submit()
        for e in task.executions:
            await stack.execution_in(e.execution_id, ENDED)
        await submit_group(stack.bus, stack.trajectory_address, index=version, task=task, policy_version=0)
        await stack.step_done(version)
        tasks.append(task)
    return tasks


async def test_submit_a_tasks_file_then_show_the_task(stack: Stack) -> None:
    tasks_file = stack.tmp / "tasks.jsonl"
    tasks_file.write_text(json.dumps(TASK) + "\n\n" + json.dumps({**TASK, "name": "two"}) + "\n")
    submitted = await stack.gyre_json("submit", str(tasks_file))
    assert [t["spec"]["name"] for t in submitted["tasks"]] == ["add", "two"]
    shown = await stack.gyre_json("tasks", "show", submitted["tasks"][1]["task_id"])
    # The scheduler advances the task as its executions run; which state depends on timing.
    assert shown["task"]["state"] in {"pending", "admitted", "running", "done", "graded", "trained"}
    assert len(shown["task"]["executions"]) == 2
    assert shown["progress"]["group_size"] == 2


async def test_a_malformed_tasks_file_names_the_line_and_field(stack: Stack) -> None:
    tasks_file = stack.tmp / "bad.jsonl"
    tasks_file.write_text(json.dumps(TASK) + "\n" + json.dumps({**TASK, "group_size": "two"}) + "\n")
    rc, out, err = await stack.gyre("submit", str(tasks_file))
    assert rc == 2 and out == ""  # an input error
    assert err.strip().splitlines() == [
        f"gyre submit: {tasks_file} line 2, field group_size: must be an integer >= 1, got 'two'"
    ]


async def test_a_field_the_scheduler_refuses_is_named_by_its_line(stack: Stack) -> None:
    tasks_file = stack.tmp / "refused.jsonl"
    tasks_file.write_text(json.dumps(TASK) + "\n\n" + json.dumps({**TASK, "family": "Not-A-Family"}) + "\n")
    rc, _, err = await stack.gyre("submit", str(tasks_file))
    assert rc == 2 and len(err.strip().splitlines()) == 1
    assert f"{tasks_file} line 3, field family: must be 1..64 of [a-z0-9_]" in err


async def test_an_unknown_task_is_a_one_line_error(stack: Stack) -> None:
    missing = str(uuid.uuid4())
    rc, _, err = await stack.gyre("tasks", "show", missing)
    assert (rc, err.strip()) == (1, f"gyre tasks show: task {missing} does not exist")


async def test_an_unreachable_service_is_named_with_how_to_start_it(stack: Stack) -> None:
    env = {**stack.env, "GYRE_RUNNER_ADDRESS": f"127.0.0.1:{closed_port()}"}
    rc, _, err = await stack.gyre("executions", "show", str(uuid.uuid4()), env=env)
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert f"the runner service at {env['GYRE_RUNNER_ADDRESS']} is not reachable: start" in err
    assert "`gyre up`" in err and "GYRE_RUNNER_ADDRESS" in err


async def test_an_execution_shows_the_runners_record_and_its_tree(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    execution_id = two_steps[0].executions[0].execution_id
    shown = await stack.gyre_json("executions", "show", execution_id)
    assert shown["state"] == "finished" and shown["execution"]["execution"]["task_id"] == two_steps[0].task_id
    assert [t["selected"] for t in shown["tree"]["trajectories"]] == [True]


async def test_cancel_stops_a_running_execution(stack: Stack) -> None:
    task = await stack.submit(SLEEPY)
    ids = [e.execution_id for e in task.executions]
    for e in ids:
        await stack.execution_in(e, (runner_pb2.EXECUTION_STATE_RUNNING,))
    cancelled = await stack.gyre_json("cancel", *ids)
    assert [e["state"] for e in cancelled["executions"]] == ["cancelled", "cancelled"]


def scheduler_serves(rpc: str) -> bool:
    """Whether this checkout's scheduler contract has `rpc` (issue 12 adds CancelTask, ListExecutions)."""
    return rpc in scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"].methods_by_name


async def test_cancelling_an_unknown_task_is_a_one_line_error(stack: Stack) -> None:
    missing = str(uuid.uuid4())
    rc, _, err = await stack.gyre("cancel", "--task", missing)
    assert rc == 1 and len(err.strip().splitlines()) == 1
    if scheduler_serves("CancelTask"):
        assert missing in err
    else:  # said plainly, not faked through the runner
        assert "needs the scheduler's CancelTask RPC" in err


async def test_executions_list_shows_the_schedulers_states(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    task = two_steps[0]
    if not scheduler_serves("ListExecutions"):
        rc, _, err = await stack.gyre("executions", "list", "--task", task.task_id)
        assert rc == 1 and "needs the scheduler's ListExecutions RPC" in err
        return
    listed = await stack.gyre_json("executions", "list", "--task", task.task_id)
    assert [e["execution"]["execution_id"] for e in listed["executions"]] == [
        e.execution_id for e in task.executions
    ]
    assert all(e["state"] not in ("pending", "admitted", "running") for e in listed["executions"])


async def test_tasks_list_pages_through_the_schedulers_tasks(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    listed = await stack.scheduler.ListTasks(scheduler_pb2.ListTasksRequest(page_size=1000))
    ids = [t.task_id for t in listed.tasks]
    assert {t.task_id for t in two_steps} <= set(ids)
    first = await stack.gyre_json("tasks", "list", "--limit", "1")
    rest = await stack.gyre_json("tasks", "list", "--limit", "0", "--page-token", first["next_page_token"])
    assert [t["task_id"] for t in first["tasks"] + rest["tasks"]] == ids and not rest["next_page_token"]
    rc, _, err = await stack.gyre("tasks", "list", "--state", "finished")
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "state" in err and "graded" in err


async def test_replay_step_re_derives_the_checksum_the_trainer_recorded(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    request = trainer_pb2.GetStepRequest()
    request.version.steps = 1
    recorded = (await stack.trainer.GetStep(request)).step
    assert len(recorded.batch_sha256) == 64 and list(recorded.task_ids) == [two_steps[0].task_id]
    replayed = await stack.gyre_json("replay", "step", "1")
    assert replayed["recorded_sha256"] == recorded.batch_sha256
    assert replayed["derived_sha256"] == recorded.batch_sha256 and replayed["match"] is True
    assert replayed["num_trained"] == recorded.num_samples == 2


async def test_replay_step_detects_a_batch_that_changed_since(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    execution_id = two_steps[0].executions[0].execution_id
    pg = await asyncpg.connect(libpq_url(stack.database_url))
    try:  # a reward rewritten behind the trainer's back changes the advantages the step trained on
        await pg.execute("UPDATE trajectory.rewards SET reward = 0.25 WHERE execution_id = $1", execution_id)
        rc, out, err = await stack.gyre("replay", "step", "1", "--json")
    finally:
        await pg.execute("UPDATE trajectory.rewards SET reward = 1.0 WHERE execution_id = $1", execution_id)
        await pg.close()
    assert rc == 1 and json.loads(out)["match"] is False
    assert "the re-derived batch" in err and "differs from the one the trainer recorded" in err


async def test_replay_of_a_step_never_trained_is_refused(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    rc, out, err = await stack.gyre("replay", "step", "99")
    assert rc == 1 and out == ""
    assert err.strip() == "gyre replay step: step 99 was never trained: the latest step is 2"


async def test_replay_rebuilds_each_services_event_sourced_columns(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    """In-process (the command's own path is run by the test below): every replayed row matches."""
    pg = await asyncpg.connect(libpq_url(stack.database_url))
    try:
        for service in ("scheduler", "runner", "trainer"):
            result = await replay_outbox(pg, projection_of(service), OutboxRange())
            assert result.same and result.num_events > 0, (service, result.diffs)
            assert all(d.num_replayed == d.num_live for d in result.diffs), service
            assert sum(d.num_replayed for d in result.diffs) > 0, service
    finally:
        await pg.close()


async def test_replay_reports_a_live_row_its_events_do_not_give(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    env = {**stack.env, "GYRE_DATABASE_URL": stack.database_url}
    task_id = two_steps[0].task_id
    pg = await asyncpg.connect(libpq_url(stack.database_url))
    try:
        await pg.execute(
            "UPDATE scheduler.tasks SET prompt = 'edited' WHERE task_id = $1", uuid.UUID(task_id)
        )
        rc, out, err = await stack.gyre("replay", "--service", "scheduler", "--json", env=env)
    finally:
        await pg.execute(
            "UPDATE scheduler.tasks SET prompt = $2 WHERE task_id = $1", uuid.UUID(task_id), "2+2?"
        )
        await pg.close()
    tasks = next(d for d in json.loads(out)["diffs"] if d["table"] == "tasks")
    assert rc == 1 and [r["prompt"] for r in tasks["only_live"]] == ["edited"]
    assert "the live tasks projection(s) differ" in err
    with pytest.raises(InvalidArgument, match="proxy has no event-sourced projection"):
        check_service("proxy")


async def test_staleness_explains_a_stale_sample(stack: Stack, two_steps: list[scheduler_pb2.Task]) -> None:
    [step] = (await stack.gyre_json("staleness", "--step", "2"))["steps"]
    assert (step["trainer_version"], step["distribution"]) == (1, {"1": 2})
    stale = step["stale"][0]
    assert stale["staleness_steps"] == 1 and stale["trained"] is True
    assert stale["tokens_by_version"] == [{"version": 0, "first_token": 3, "last_token": 5, "num_tokens": 3}]
    assert None not in (stale["admitted_at"], stale["started_at"], stale["ended_at"], stale["consumed_at"])
    assert list(stale["waited_s"]) == [
        "a rollout slot",
        "its own rollout",
        "the rest of its group",
        "the trainer (rewards, queue, earlier steps)",
    ]
    assert stale["waited_most_for"] in stale["waited_s"] and stale["notes"] == []


async def test_status_reports_the_version_and_the_last_steps_staleness(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    status = await stack.gyre_json("status")
    assert status["version"] == 2
    assert status["last_step"]["staleness_max_steps"] == 1
    assert status["services"]["scheduler"].startswith("serving")
    assert status["services"]["evaluator"].startswith("unreachable")
    if scheduler_serves("GetCells"):
        assert "cells" in status["cells"]
    else:
        assert "GetCells" in status["cells"]["not_available"]


async def test_trace_export_writes_a_workload_gyre_sim_reads(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    async def lengths_recorded() -> bool:  # the scheduler consumes the runner's end events
        for task in two_steps:
            request = scheduler_pb2.ListExecutionsRequest(task_id=task.task_id)
            if not all(
                e.HasField("duration_s") for e in (await stack.scheduler.ListExecutions(request)).executions
            ):
                return False
        return True

    await eventually(lengths_recorded, timeout_s=30, what="the scheduler to record the lengths")
    out = stack.tmp / "trace"
    summary = await stack.gyre_json("trace", "export", str(out), "--name", "run1")
    assert (summary["num_executions"], summary["num_calls"], summary["skipped"]) == (4, 4, {})
    workload = load_workload(out / "run1.yaml")
    assert (workload.steps, workload.groups_per_step, workload.group_size) == (2, 1, 2)
    records = [json.loads(line) for line in (out / "run1.jsonl").read_text().splitlines()]
    # In admission order, each with the length the scheduler recorded from the runner's end event.
    assert [r["execution_id"] for r in records] == [e.execution_id for t in two_steps for e in t.executions]
    scheduler = {}
    for task in two_steps:
        listed = await stack.scheduler.ListExecutions(
            scheduler_pb2.ListExecutionsRequest(task_id=task.task_id)
        )
        scheduler.update({e.execution.execution_id: e.duration_s for e in listed.executions})
    assert workload.duration.values == tuple(scheduler[r["execution_id"]] for r in records)
    assert workload.tokens.values == (6.0, 6.0, 6.0, 6.0)  # prompt 3 + output 3, one selected trajectory each


async def test_the_client_watches_a_task_until_its_group_is_ready(
    stack: Stack, two_steps: list[scheduler_pb2.Task]
) -> None:
    """Last in the file: the group it makes ready is trained as step 3."""
    addresses = ServiceAddresses.resolve(env=stack.env)
    async with GyreClient(addresses) as client:
        [task] = await client.submit([scheduler_pb2.TaskSpec(harness="gyre-agent", **TASK)])
        seen: list[TaskProgress] = []

        async def follow() -> None:
            async for progress in client.watch([task.task_id], poll_s=0.2, timeout_s=90):
                seen.append(progress)

        watching = asyncio.create_task(follow())
        for e in task.executions:
            await stack.execution_in(e.execution_id, ENDED)
        await submit_group(stack.bus, stack.trajectory_address, index=9, task=task)
        await asyncio.wait_for(watching, timeout=90)
    assert seen[-1].ready and seen[-1].rewards == (1.0, 0.0)
    assert not seen[0].ready


async def test_tasks_generate_still_reaches_the_evaluators_generator(tmp_path: Path) -> None:
    """`gyre tasks` holds list/show and the evaluator's `generate`, whose own parser takes its options."""
    out = tmp_path / "set"
    argv = ["tasks", "generate", "--family", "repair", "--count", "1", "--out", str(out)]
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "gyre_app.cli", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["out"] == str(out) and out.is_dir()


async def test_status_shows_a_dead_letter_and_a_group_stuck_without_its_evaluator(stack: Stack) -> None:
    """This stack runs no evaluator: a group whose executions ended waits for it, and says so.
    Last among the stack's tests: the group stays untrained."""
    env = {**stack.env, "GYRE_BUS_PREFIX": stack.bus.prefix}
    task = await stack.submit()
    for e in task.executions:
        await stack.execution_in(e.execution_id, ENDED)
    # Bytes no consumer can decode, where the scheduler reads the runner's end events.
    subject = f"{stack.bus.prefix}.runner.v1.ExecutionFinished"
    await stack.bus.js.publish(subject, b"not an envelope", headers={"Nats-Msg-Id": uuid.uuid4().hex})
    status: dict[str, Any] = {}

    async def shown() -> bool:
        status.update(await stack.gyre_json("status", env=env))
        stuck = [g for g in status["waiting"]["groups"] if g["task_id"] == task.task_id]
        return status["dependencies"]["dead_letters"] >= 1 and bool(stuck) and "evaluator" in stuck[0]["why"]

    await eventually(shown, timeout_s=60, what="status to show the dead letter and the stuck group")
    assert (status["dependencies"]["nats"], status["dependencies"]["postgres"]) == ("ok", "ok")
    [stuck] = [g for g in status["waiting"]["groups"] if g["task_id"] == task.task_id]
    assert stuck["why"] == "2 executions ended, not graded yet (evaluator)" and stuck["waited_s"] >= 0
    reasons = [d["reason"] for d in (await stack.gyre_json("dead-letters", "list", env=env))["dead_letters"]]
    assert any(r.startswith("undecodable") for r in reasons), reasons
    # The operator's way out: cancelling the task clears the stuck group from what status waits for.
    rc, _, err = await stack.gyre("cancel", "--task", task.task_id, env=env)
    assert rc == 0, err

    async def cleared() -> bool:
        waiting = (await stack.gyre_json("status", env=env))["waiting"]["groups"]
        return not [g for g in waiting if g["task_id"] == task.task_id]

    await eventually(cleared, timeout_s=60, what="status to stop listing the cancelled task's group")
