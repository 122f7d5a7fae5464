"""The runner on real NATS and Postgres: the built-in agent in a sandbox, against a scripted model."""

from __future__ import annotations

import asyncio
import os
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import nats
import pytest
import pytest_asyncio

from bench.scripted_model import ScriptedModel
from gyre.bus import Bus, BusConfig
from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.db.engine import libpq_url
from gyre.db.outbox_replay import OutboxRange, replay_outbox
from gyre.events import new_event, stream_name
from gyre.runner.v1 import events_pb2 as runner_events_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.scheduler.v1 import events_pb2 as scheduler_events_pb2
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from services.runner.config import BUNDLED_TASKS as BUNDLED
from services.runner.config import RunnerSettings
from services.runner.event_projection import PROJECTION as RUNNER_EVENTS
from services.runner.main import build_with_supervisor
from services.runner.supervisor import Supervisor
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent

SCRIPT = {
    "main": [
        {"tool": "write_file", "args": {"path": "hello.py", "content": "print('hello')\n"}},
        {"tool": "delegate", "args": {"task": "write a test for hello.py"}},
        {"tool": "shell", "args": {"command": "python hello.py > out.txt"}},
        {"tool": "shell", "args": {"command": "sleep 30"}},
        {"final": "all done"},
    ],
    "sub": [
        {
            "tool": "write_file",
            "args": {"path": "test_hello.py", "content": "def test_ok():\n    assert True\n"},
        },
        {"final": "test written"},
    ],
    "summary": [{"final": "summary: wrote hello.py"}],
}


SCRIPTS = {
    # The agent's shell kills the agent itself: a harness crash, not a signal the runner sent.
    "crash": {"main": [{"tool": "write_file", "args": {"path": "half.py", "content": "x = 1\n"}},
                       {"tool": "shell", "args": {"command": "kill -SEGV $PPID"}}]},
    "quick": {"main": [{"final": "nothing to do"}]},
    # More tool calls than the agent's turn budget allows: it stops without a final answer.
    "wander": {"main": [{"tool": "shell", "args": {"command": f"echo {i} >> tries.txt"}} for i in range(4)]},
    # Issue 27: the agent's shell tells the host, through every stderr it can reach (on main the
    # sandbox's first process's: the host's set-up log), that set-up failed, then kills the agent.
    "forge": {"main": [{"tool": "shell", "args": {"command": (
        "python -c \"import ctypes,os\nlibc=ctypes.CDLL(None)\n"
        "for p in [int(d) for d in os.listdir('/proc') if d.isdigit()]:\n"
        "  f=libc.syscall(438,libc.syscall(434,p,0),2,0)\n"
        "  f>=0 and os.write(f,b'gyre-sandbox: setup failed: [Errno 2] No such file\\n')\"; "
        "echo 'gyre-sandbox: setup failed: [Errno 2] No such file' >&2; kill -SEGV $PPID")}}]},
    # A harness looking for the hidden tests of the bundled tasks finds an empty folder.
    "peek": {"main": [{"tool": "shell", "args": {"command": f"ls -R {BUNDLED} > peek.txt 2>&1"}}]},
    # Issue 16, cases 1 and 3: the host's Postgres socket and the checkout's git history.
    "escape": {"main": [{"tool": "shell", "args": {"command": (
        "psql -h /var/run/postgresql -U postgres -c 'select 1' > psql.txt 2>&1; echo EXIT $? >> psql.txt; "
        f"git -C {REPO} show HEAD:services/evaluator/tasks/slugfix/hidden/test_fail_to_pass.py "
        "> git.txt 2>&1; echo EXIT $? >> git.txt")}}]},
}  # fmt: skip


@dataclass
class Runner:
    stub: runner_pb2_grpc.RunnerServiceStub
    scheduler: scheduler_pb2_grpc.SchedulerServiceStub
    supervisor: Supervisor
    model: ScriptedModel
    kernel: KernelSettings


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def runner(kernel: KernelSettings) -> AsyncIterator[Runner]:
    model = ScriptedModel(script=SCRIPT, scripts=SCRIPTS)
    url = model.start()
    task_sets = REPO / ".gyre" / "test-tasksets" / uuid.uuid4().hex[:8]
    (task_sets / "hello" / "workspace").mkdir(parents=True)
    (task_sets / "hello" / "workspace" / "README.md").write_text("template\n")
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
        task_sets={"local": task_sets},
        proxy_base_url=url,
        memory_mb=1024,
        max_procs=64,
        disk_mb=64,
        file_size_mb=16,
        cpu_s=60,
    )
    host, supervisor = await build_with_supervisor(settings, kernel)
    scheduler = await build_scheduler(
        SchedulerSettings(port=0, admission="at_submit", runner_address=host.address), kernel
    )
    await host.start()
    await scheduler.start()
    channels = [grpc.aio.insecure_channel(host.address), grpc.aio.insecure_channel(scheduler.address)]
    yield Runner(
        stub=runner_pb2_grpc.RunnerServiceStub(channels[0]),
        scheduler=scheduler_pb2_grpc.SchedulerServiceStub(channels[1]),
        supervisor=supervisor,
        model=model,
        kernel=kernel,
    )
    for ch in channels:
        await ch.close()
    await host.stop()
    if not os.environ.get("GYRE_KEEP_SANDBOXES"):
        supervisor.host.sweep()
        supervisor.host.root.rmdir()
    await scheduler.stop()
    model.stop()
    shutil.rmtree(task_sets)


def start_request(**change: object) -> runner_pb2.StartExecutionRequest:
    fields: dict[str, object] = {
        "request_id": f"start-{uuid.uuid4().hex[:8]}",
        "execution": ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4())),
        "harness": "gyre-agent",
        "prompt": "Write hello.py.",
        "timeout_s": 60.0,
        "family": "terminal",
        "harness_env": {"GYRE_AGENT_CONTEXT_TOKENS": "150"},
    }
    fields.update(change)
    return runner_pb2.StartExecutionRequest(**fields)  # type: ignore[arg-type]


def in_workspace(ex: runner_pb2.Execution, name: str) -> Path:
    return Path(ex.workspace_uri.removeprefix("file://"), name)


async def wait_ended(r: Runner, execution_id: str, *, within_s: float = 60) -> runner_pb2.Execution:
    for _ in range(int(within_s * 5)):  # bounded
        try:
            ex = (
                await r.stub.GetExecution(runner_pb2.GetExecutionRequest(execution_id=execution_id))
            ).execution
        except grpc.aio.AioRpcError as err:  # a scheduled execution the runner has not consumed yet
            assert err.code() == grpc.StatusCode.NOT_FOUND, err
            await asyncio.sleep(0.2)
            continue
        if ex.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING):
            return ex
        await asyncio.sleep(0.2)
    raise AssertionError(f"execution {execution_id} never ended")


async def runner_events(kernel: KernelSettings) -> list[envelope_pb2.Envelope]:
    nc = await nats.connect(kernel.nats_url)
    js = nc.jetstream()
    stream = stream_name("runner", prefix=kernel.bus_prefix)
    info = await js.stream_info(stream)
    out = []
    for seq in range(max(info.state.first_seq, 1), info.state.last_seq + 1):  # empty: 0..0
        msg = await js.get_msg(stream, seq)
        env = envelope_pb2.Envelope()
        env.ParseFromString(msg.data or b"")
        out.append(env)
    await nc.close()
    return out


async def test_the_agent_runs_in_its_sandbox_and_times_out_with_its_workspace_kept(runner: Runner) -> None:
    request = start_request(timeout_s=8.0)
    started = (await runner.stub.StartExecution(request)).execution
    assert started.state == runner_pb2.EXECUTION_STATE_RUNNING
    assert started.workspace_uri.startswith("file://")
    ended = await wait_ended(runner, request.execution.execution_id)
    assert ended.state == runner_pb2.EXECUTION_STATE_TIMED_OUT  # the script sleeps past the deadline
    # the session's bus holds other modules' runner events too: this execution's own end
    [end] = [
        e
        for e in await runner_events(runner.kernel)
        if e.correlation_id == request.execution.task_id and e.event_type.endswith("ExecutionTimedOut")
    ]
    timed_out = runner_events_pb2.ExecutionTimedOut()
    end.payload.Unpack(timed_out)
    assert timed_out.limit == runner_events_pb2.TIMEOUT_LIMIT_DEADLINE  # the runner killed it
    work = Path(started.workspace_uri.removeprefix("file://"))
    assert (work / "hello.py").read_text() == "print('hello')\n"
    assert (work / "test_hello.py").exists(), "the sub-agent's file"
    assert (work / "out.txt").read_text() == "hello\n"
    calls = [s for s in runner.model.seen if s.token and s.agent_id]
    roles = {(s.role, s.agent_id) for s in calls}
    assert {("main", "main"), ("sub", "sub-1"), ("summary", "main")} <= roles, roles
    tokens = {s.token for s in calls}
    assert len(tokens) == 1 and len(tokens.pop()) >= 32
    # a repeated request returns the first answer
    again = (await runner.stub.StartExecution(request)).execution
    assert again.state == runner_pb2.EXECUTION_STATE_TIMED_OUT


async def test_tokens_never_travel_on_the_bus(runner: Runner) -> None:
    tokens = {s.token for s in runner.model.seen if s.token}
    assert tokens
    events = await runner_events(runner.kernel)
    names = {e.event_type.rsplit(".", 1)[1] for e in events}
    assert {"ExecutionStarted", "ExecutionTimedOut"} <= names
    for env in events:
        raw = env.SerializeToString()
        assert not any(t.encode() in raw for t in tokens)


async def test_cancel_kills_the_harness_and_keeps_the_workspace(runner: Runner) -> None:
    request = start_request(prompt="Sleep.", harness_env={})
    await runner.stub.StartExecution(request)
    eid = request.execution.execution_id
    for _ in range(100):  # wait for the agent to reach its sleep (bounded: 20 s)
        if (Path(runner.supervisor.running[eid].box.work) / "out.txt").exists():  # type: ignore[union-attr]
            break
        await asyncio.sleep(0.2)
    cancel = runner_pb2.CancelExecutionRequest(request_id=f"c-{eid[:8]}", execution_id=eid, reason="test")
    ex = (await runner.stub.CancelExecution(cancel)).execution
    assert ex.state == runner_pb2.EXECUTION_STATE_CANCELLED
    assert in_workspace(ex, "hello.py").exists()


async def test_cancel_task_stops_its_running_harness_through_the_runner(runner: Runner) -> None:
    spec = scheduler_pb2.TaskSpec(
        name="sleepy", family="terminal", prompt="Sleep.", group_size=1, timeout_s=60, harness="gyre-agent"
    )
    task = (
        await runner.scheduler.SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(request_id="sleepy-1", tasks=[spec])
        )
    ).tasks[0]
    eid = task.executions[0].execution_id

    async def state() -> int:
        listed = await runner.scheduler.ListExecutions(
            scheduler_pb2.ListExecutionsRequest(task_id=task.task_id)
        )
        return listed.executions[0].state

    for _ in range(150):  # the scheduler sees the runner's ExecutionStarted (bounded: 30 s)
        if await state() == scheduler_pb2.EXECUTION_STATE_RUNNING:
            break
        await asyncio.sleep(0.2)
    assert await state() == scheduler_pb2.EXECUTION_STATE_RUNNING
    answer = await runner.scheduler.CancelTask(
        scheduler_pb2.CancelTaskRequest(request_id="cancel-sleepy", task_id=task.task_id, reason="test")
    )
    assert answer.previous_state == scheduler_pb2.TASK_STATE_RUNNING and answer.num_executions_stopped == 1
    ended = await wait_ended(runner, eid)
    assert ended.state == runner_pb2.EXECUTION_STATE_CANCELLED
    assert await state() == scheduler_pb2.EXECUTION_STATE_CANCELLED


async def test_exit_0_finishes_and_any_other_end_is_a_crash_with_the_workspace_kept(runner: Runner) -> None:
    quick, crash = start_request(prompt="[script: quick]"), start_request(prompt="[script: crash]")
    peek = start_request(prompt="[script: peek]")
    for request in (quick, crash, peek):
        await runner.stub.StartExecution(request)
    finished = await wait_ended(runner, quick.execution.execution_id)
    assert finished.state == runner_pb2.EXECUTION_STATE_FINISHED and finished.exit_code == 0
    peeked = await wait_ended(runner, peek.execution.execution_id)
    listing = in_workspace(peeked, "peek.txt").read_text()
    assert "wordfreq" not in listing and "test_" not in listing, listing
    crashed = await wait_ended(runner, crash.execution.execution_id)
    assert crashed.state == runner_pb2.EXECUTION_STATE_FAILED
    assert crashed.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED
    assert crashed.exit_code == 128 + 11 and "signal 11 (SIGSEGV)" in crashed.failure.reason
    assert in_workspace(crashed, "half.py").read_text() == "x = 1\n"  # kept for partial credit
    events = {
        e.event_type.rsplit(".", 1)[1]: e
        for e in await runner_events(runner.kernel)
        if e.correlation_id == crash.execution.task_id
    }
    failed = runner_events_pb2.ExecutionFailed()
    events["ExecutionFailed"].payload.Unpack(failed)
    assert failed.exit_code == 139 and failed.workspace_uri == crashed.workspace_uri


async def test_a_harness_that_forges_a_setup_failure_ends_as_its_own_crash(runner: Runner) -> None:
    """Set-up failure is the keeper's record, made before the harness ran: no line the harness
    writes anywhere turns its crash into an ungraded infrastructure failure."""
    forge = start_request(prompt="[script: forge]")
    await runner.stub.StartExecution(forge)
    ended = await wait_ended(runner, forge.execution.execution_id)
    assert ended.state == runner_pb2.EXECUTION_STATE_FAILED
    assert ended.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED, ended.failure.reason
    assert ended.exit_code == 128 + 11


async def test_an_agent_out_of_turns_times_out_with_its_workspace_graded_as_it_stands(runner: Runner) -> None:
    # The agent's own budget is a deadline too: the turns ran out before it declared the work done.
    request = start_request(prompt="[script: wander]", harness_env={"GYRE_AGENT_MAX_TURNS": "2"})
    await runner.stub.StartExecution(request)
    ended = await wait_ended(runner, request.execution.execution_id)
    assert ended.state == runner_pb2.EXECUTION_STATE_TIMED_OUT
    assert in_workspace(ended, "tries.txt").read_text() == "0\n1\n"  # both turns' work kept
    mine = [e for e in await runner_events(runner.kernel) if e.correlation_id == request.execution.task_id]
    kinds = [e.event_type.rsplit(".", 1)[1] for e in mine]
    assert kinds[-1] == "ExecutionTimedOut", kinds
    timed_out = runner_events_pb2.ExecutionTimedOut()
    mine[-1].payload.Unpack(timed_out)
    assert timed_out.limit == runner_events_pb2.TIMEOUT_LIMIT_HARNESS_BUDGET  # not the wall clock


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"harness": "bash"}, "harness"),
        ({"prompt": " "}, "prompt"),
        ({"timeout_s": 0.0}, "timeout_s"),
        ({"workspace_template": "/nonexistent/template"}, "workspace_template"),
        ({"workspace_template": "/etc/ssl"}, "workspace_template"),
        ({"workspace_template": "git+file:///etc"}, "workspace_template"),
        ({"workspace_template": "taskset:nope/hello"}, "workspace_template"),
        ({"workspace_template": "task:no-such-task"}, "workspace_template"),
        ({"harness_env": {"OPENAI_API_KEY": "x"}}, "harness_env['OPENAI_API_KEY']"),
        ({"harness_env": {"GYRE_HARNESS_MAX_TURNS": "-1"}}, "harness_env['GYRE_HARNESS_MAX_TURNS']"),
        ({"harness_env": {"GYRE_CLAUDE_CODE_TOOLS": "Bash;rm"}}, "harness_env['GYRE_CLAUDE_CODE_TOOLS']"),
        ({"execution": ids_pb2.ExecutionRef(task_id="t", execution_id="e")}, "execution.task_id"),
    ],
)
async def test_bad_requests_name_the_field(runner: Runner, change: dict[str, object], field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await runner.stub.StartExecution(start_request(**change))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith(f"{field}:"), err.value.details()


async def test_scheduled_executions_run_and_a_missing_template_fails_cleanly(runner: Runner) -> None:
    spec = scheduler_pb2.TaskSpec(
        name="hello",
        family="terminal",
        prompt="Write hello.py.",
        group_size=2,
        timeout_s=5.0,
        harness="gyre-agent",
        workspace_template="taskset:local/hello",
    )
    bad = scheduler_pb2.TaskSpec(
        name="gone",
        family="terminal",
        prompt="x",
        group_size=1,
        timeout_s=5.0,
        harness="gyre-agent",
        workspace_template="taskset:local/missing",
    )
    submitted = await runner.scheduler.SubmitTasks(
        scheduler_pb2.SubmitTasksRequest(request_id=f"sub-{uuid.uuid4().hex[:8]}", tasks=[spec, bad])
    )
    good_ids = [e.execution_id for e in submitted.tasks[0].executions]
    bad_id = submitted.tasks[1].executions[0].execution_id
    for eid in good_ids:
        ex = await wait_ended(runner, eid)
        assert ex.state == runner_pb2.EXECUTION_STATE_TIMED_OUT
        assert in_workspace(ex, "README.md").read_text() == "template\n"
    failed = await wait_ended(runner, bad_id)
    assert failed.state == runner_pb2.EXECUTION_STATE_FAILED
    assert failed.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_WORKSPACE
    assert "missing" in failed.failure.reason


async def test_the_harness_reaches_neither_host_sockets_nor_the_checkout(runner: Runner) -> None:
    request = start_request(prompt="[script: escape]")
    await runner.stub.StartExecution(request)
    ended = await wait_ended(runner, request.execution.execution_id)
    psql, git = in_workspace(ended, "psql.txt").read_text(), in_workspace(ended, "git.txt").read_text()
    assert "EXIT 0" not in psql and "?column?" not in psql, psql
    assert "EXIT 0" not in git and "slugify" not in git, git


async def test_submit_tasks_refuses_a_host_folder_as_template(runner: Runner) -> None:
    spec = scheduler_pb2.TaskSpec(
        name="ssl", family="terminal", prompt="p", group_size=1, timeout_s=5.0, harness="gyre-agent",
        workspace_template="/etc/ssl",
    )  # fmt: skip
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await runner.scheduler.SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(request_id=f"sub-{uuid.uuid4().hex[:8]}", tasks=[spec])
        )
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (err.value.details() or "").startswith("tasks[0].workspace_template:"), err.value.details()


async def test_a_filled_workspace_is_private_to_its_execution_and_wiped_on_release(runner: Runner) -> None:
    request = start_request(prompt="[script: quick]", workspace_template="task:wordfreq")
    await runner.stub.StartExecution(request)
    ended = await wait_ended(runner, request.execution.execution_id)
    box = runner.supervisor.ended[request.execution.execution_id][0]
    st = box.work.stat()
    assert (st.st_mode & 0o777, st.st_uid) == (0o700, box.uid), ended
    assert in_workspace(ended, "README.md").exists()
    await runner.supervisor.release(request.execution.execution_id)
    assert not box.work.exists() and not box.path.exists()


async def publish_scheduled(runner: Runner, ref: ids_pb2.ExecutionRef, *, prompt: str, harness: str) -> None:
    """An ExecutionScheduled on the bus, as the scheduler would publish it."""
    bus = await Bus.connect(BusConfig(url=runner.kernel.nats_url or "", prefix=runner.kernel.bus_prefix))
    try:
        scheduled = scheduler_events_pb2.ExecutionScheduled(
            execution=ref, family="terminal", prompt=prompt, harness=harness, timeout_s=60
        )
        await bus.publish(new_event(scheduled, producer="scheduler", correlation_id=ref.task_id))
    finally:
        await bus.close()


async def test_an_execution_cancelled_before_it_was_scheduled_here_never_starts(runner: Runner) -> None:
    """CancelTask reaches the runner before the runner took the ExecutionScheduled up: when that
    event comes, the execution ends cancelled without starting (no harness, no workspace)."""
    ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
    cancel = runner_pb2.CancelExecutionRequest(
        request_id=f"early-{ref.execution_id[:8]}", execution_id=ref.execution_id, reason="task cancelled"
    )
    answer = (await runner.stub.CancelExecution(cancel)).execution
    assert answer.state == runner_pb2.EXECUTION_STATE_CANCELLED
    assert (await runner.stub.CancelExecution(cancel)).execution == answer  # the same answer again
    await publish_scheduled(runner, ref, prompt="Sleep.", harness="gyre-agent")
    ended = await wait_ended(runner, ref.execution_id)
    assert ended.state == runner_pb2.EXECUTION_STATE_CANCELLED
    assert not ended.HasField("started_at") and ended.workspace_uri == ""
    assert ref.execution_id not in runner.supervisor.running
    types = [
        e.event_type.rsplit(".", 1)[1]
        for e in await runner_events(runner.kernel)
        if e.correlation_id == ref.task_id
    ]
    assert types == ["ExecutionCancelled"]


async def test_a_refused_launch_is_stored_as_its_event_says(runner: Runner) -> None:
    """An ExecutionScheduled the runner refuses (an unknown harness) ends failed; the row holds the
    reason its ExecutionFailed carries, so replaying the runner's events rebuilds every row."""
    ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
    await publish_scheduled(runner, ref, prompt="x", harness="no-such-harness")
    ended = await wait_ended(runner, ref.execution_id)
    assert ended.state == runner_pb2.EXECUTION_STATE_FAILED
    assert ended.failure.reason.startswith("bad scheduled execution: harness")
    assert runner.kernel.database_url is not None
    pg = await asyncpg.connect(libpq_url(runner.kernel.database_url))
    try:
        replayed = await replay_outbox(pg, RUNNER_EVENTS, OutboxRange())
    finally:
        await pg.close()
    assert replayed.same, replayed.diffs
    assert replayed.diffs[0].num_replayed >= 1
