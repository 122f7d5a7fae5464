"""A runner stopped gracefully while a harness runs leaves the harness alone, as a crash does: its
keeper and sandbox outlive the runner for the next one to adopt (tests/test_runner_reattach.py),
and `gyre down`'s sweep then leaves nothing behind (no keeper, no mount, no folder). Real NATS,
Postgres and sandboxes; the model is scripted (an external boundary)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import grpc
import pytest

from bench.scripted_model import ScriptedModel
from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.adopt import sweep_leftovers
from gyre.sandbox.keeper import KEEPER_FILE, read_keeper, start_time
from gyre.settings import KernelSettings
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parent.parent
SLEEPER = {"main": [{"tool": "shell", "args": {"command": "sleep 120"}}]}


def mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/self/mounts").read_text().splitlines()
    return [line.split()[1] for line in lines if line.split()[1].startswith(f"{root}/")]


async def test_a_stopped_runner_leaves_its_harness_running_until_the_stack_is_swept(
    kernel: KernelSettings,
) -> None:
    model = ScriptedModel(script=SLEEPER)
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / f"stop-{uuid.uuid4().hex[:8]}",
        proxy_base_url=model.start(),
        memory_mb=512,
        max_procs=64,
        disk_mb=32,
        cpu_s=60,
    )
    host, supervisor = await build_with_supervisor(settings, kernel)
    root = supervisor.host.root
    await host.start()
    request = runner_pb2.StartExecutionRequest(
        request_id=f"start-{uuid.uuid4().hex[:8]}",
        execution=ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4())),
        harness="gyre-agent",
        prompt="Sleep.",
        timeout_s=120.0,
        family="terminal",
    )
    try:
        async with grpc.aio.insecure_channel(host.address) as channel:
            started = (await runner_pb2_grpc.RunnerServiceStub(channel).StartExecution(request)).execution
        assert started.state == runner_pb2.EXECUTION_STATE_RUNNING
        for _ in range(300):  # bounded: until the agent called the model (its shell then sleeps)
            if model.seen:
                break
            await asyncio.sleep(0.1)
        box = root / request.execution.execution_id
        keeper = read_keeper(box / "log" / KEEPER_FILE)
        assert keeper is not None and start_time(keeper[0]) == keeper[1]
        if supervisor.host.isolation.tmpfs_quota:
            assert mounts_under(root) == [str(box)]
        await host.stop()
        assert start_time(keeper[0]) == keeper[1], "the stop killed the harness's keeper"
        assert (box / "work").is_dir(), "the stop deleted the workspace"
        assert not (box / "log" / "outcome.json").exists(), "the harness ended with its runner"
        assert sweep_leftovers(settings.sandbox_root, uid_base=settings.uid_base) == 1
        assert mounts_under(root) == []
        assert list(root.iterdir()) == []
        assert start_time(keeper[0]) != keeper[1], "the keeper outlived the sweep"
    finally:
        supervisor.host.sweep()
        root.rmdir()
        model.stop()
