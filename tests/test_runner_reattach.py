"""A runner killed with -9, or stopped gracefully (SIGTERM: `gyre restart runner`, a deploy),
mid-execution: the harness lives on in its sandbox, the restarted runner re-attaches to it, ends it
once (finished, as the harness ended), keeps its workspace until the grade arrives, and leaves no
sandbox user, cgroup or process behind (real runner processes, real NATS and Postgres, the
built-in agent against a scripted model)."""

from __future__ import annotations

import asyncio
import os
import pwd
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from bench.fault_stack import Service
from bench.scripted_model import ScriptedModel
from gyre.bus import Bus
from gyre.common.v1 import ids_pb2
from gyre.devstack.embedded import free_port
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.keeper import KEEPER_FILE, read_keeper, start_time
from gyre.sandbox.probe import probe
from gyre.sandbox.roots import usable_root
from gyre.settings import KernelSettings
from tests.test_runner import runner_events as all_runner_events

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent

SCRIPTS = {
    # The harness keeps working (and calling the model) across the runner's restart.
    "long": {"main": [
        {"tool": "write_file", "args": {"path": "before.txt", "content": "1\n"}},
        {"tool": "shell", "args": {"command": "sleep 3"}},
        {"tool": "write_file", "args": {"path": "after.txt", "content": "2\n"}},
        {"final": "done"},
    ]},
    # Sleeps past a graceful stop's own few seconds, so the next runner must be the one to end it.
    "longer": {"main": [
        {"tool": "write_file", "args": {"path": "before.txt", "content": "1\n"}},
        {"tool": "shell", "args": {"command": "sleep 8"}},
        {"tool": "write_file", "args": {"path": "after.txt", "content": "2\n"}},
        {"final": "done"},
    ]},
}  # fmt: skip


UID_BASE = 64000 + secrets.randbelow(500)
"""Sandbox users of this test's own range: any left at the end are its leak."""


def runner_process(kernel: KernelSettings, *, root: Path, model_url: str, log: Path, port: int) -> Service:
    """`python -m services.runner` on a fixed port and sandbox root, killable with -9."""
    env = {
        **os.environ,
        "GYRE_RUNNER_UID_BASE": str(UID_BASE),
        "GYRE_NATS_URL": str(kernel.nats_url),
        "GYRE_DATABASE_URL": str(kernel.database_url),
        "GYRE_BUS_PREFIX": kernel.bus_prefix,
        "GYRE_RUNNER_PORT": str(port),
        "GYRE_RUNNER_SANDBOX_ROOT": str(root),
        "GYRE_RUNNER_PROXY_BASE_URL": model_url,
        "GYRE_RUNNER_MEMORY_MB": "1024",
        "GYRE_RUNNER_MAX_PROCS": "64",
        "GYRE_RUNNER_DISK_MB": "64",
        "GYRE_RUNNER_CPU_S": "60",
    }
    argv = [sys.executable, "-m", "services.runner"]
    return Service(name="runner", argv=argv, env=env, log_path=log, ready=f"127.0.0.1:{port}")


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, str]]:
    m = ScriptedModel(script={"main": [{"final": "done"}]}, scripts=SCRIPTS)
    url = m.start()
    yield m, url
    m.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def bus(kernel: KernelSettings) -> AsyncIterator[Bus]:
    from gyre.bus import BusConfig

    assert kernel.nats_url
    b = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
    yield b
    await b.close()


async def state_of(stub: runner_pb2_grpc.RunnerServiceStub, execution_id: str) -> runner_pb2.Execution:
    answer = await stub.GetExecution(runner_pb2.GetExecutionRequest(execution_id=execution_id))
    return answer.execution


async def wait_for(predicate: object, what: str, *, within_s: float = 90.0) -> None:
    for _ in range(int(within_s / 0.2)):  # bounded
        if await predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.2)
    raise AssertionError(f"never: {what}")


@pytest.mark.parametrize("how", ["kill9", "sigterm"])
async def test_a_killed_or_stopped_runner_reattaches_to_its_running_harness_and_ends_it_once(
    how: str, kernel: KernelSettings, model: tuple[ScriptedModel, str], bus: Bus, tmp_path: Path
) -> None:
    root = REPO / ".gyre" / "test-sandboxes" / f"reattach-{uuid.uuid4().hex[:8]}"
    _, url = model
    port = free_port()
    first = runner_process(kernel, root=root, model_url=url, log=tmp_path / "runner.log", port=port)
    second = runner_process(kernel, root=root, model_url=url, log=tmp_path / "runner.log", port=port)
    stub = runner_pb2_grpc.RunnerServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
    eid = str(uuid.uuid4())
    try:
        first.start()
        await first.wait_ready()
        await stub.StartExecution(
            runner_pb2.StartExecutionRequest(
                request_id=f"start-{eid[:8]}",
                execution=ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=eid),
                harness="gyre-agent",
                prompt=f"Work for a while. [script: {'long' if how == 'kill9' else 'longer'}]",
                timeout_s=120.0,
                family="terminal",
            )
        )
        box = usable_root(root) / eid
        await wait_for(lambda: asyncio.to_thread((box / "work" / "before.txt").exists), "first file written")
        assert UID_BASE <= (box / "work").stat().st_uid < UID_BASE + 1000
        if how == "kill9":
            first.kill9()  # mid-run: the harness is inside `sleep 3`
        else:
            first.stop()  # SIGTERM, mid-run: the harness is inside `sleep 8`
            assert first.proc is not None and first.proc.returncode == 0, "the runner did not stop cleanly"
        keeper = read_keeper(box / "log" / KEEPER_FILE)
        assert keeper is not None and start_time(keeper[0]) == keeper[1], "the harness died with its runner"
        assert not (box / "log" / "outcome.json").exists(), "the harness ended before its runner did"

        second.start()
        await second.wait_ready()

        async def ended() -> bool:
            ex = await state_of(stub, eid)
            return ex.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING)

        await wait_for(ended, "the re-attached execution ended")
        ex = await state_of(stub, eid)
        assert ex.state == runner_pb2.EXECUTION_STATE_FINISHED, ex
        assert ex.exit_code == 0
        assert (box / "work" / "after.txt").read_text() == "2\n"  # worked on past the restart
        ends = [
            e.event_type
            for e in await all_runner_events(kernel)
            if e.correlation_id == ex.execution.task_id
            and e.event_type.endswith(("Finished", "Failed", "TimedOut"))
        ]
        assert ends == [runner_events.ExecutionFinished.DESCRIPTOR.full_name]

        assert box.exists()  # kept for its grade
        grade = evaluator_pb2.Grade(
            execution_id=eid, task_id=ex.execution.task_id, score=1.0, assessable=True
        )
        await bus.publish(
            new_event(evaluator_events.RewardAssigned(grade=grade), producer="evaluator", correlation_id=eid)
        )
        await wait_for(
            lambda: asyncio.to_thread(lambda: not box.exists()), "sandbox released after its grade"
        )
    finally:
        first.stop()
        second.stop()
    assert [u.pw_name for u in pwd.getpwall() if UID_BASE <= u.pw_uid < UID_BASE + 1000] == []
    caps = probe()
    for base in (caps.cgroup_memory, caps.cgroup_pids, caps.cgroup_cpu):
        assert not base or not (Path(base) / f"gyre-{eid}").exists()
    if usable_root(root).exists():
        assert list(usable_root(root).iterdir()) == []
        usable_root(root).rmdir()
