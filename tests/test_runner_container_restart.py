"""A runner restarted while container executions run: a live container is re-attached and its
execution ends as it would have; one whose container went meanwhile ends as runner lost, an
infrastructure fact, never left running (live: Podman, NATS, Postgres)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from bench.dataset_fixtures import FIXTURES, build_image, write_task
from bench.scripted_model import ScriptedModel
from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.oci import find_engine
from gyre.sandbox.oci_disk import WorkDisk, sweep_disks
from gyre.settings import KernelSettings
from gyre_app.images import DEFAULT_BASE, build_base
from services.runner.config import RunnerSettings
from services.runner.container_exec import owner_label
from services.runner.main import build_with_supervisor

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.skipif(
        find_engine() is None, reason="no container engine (.ci/run installs podman and runc)"
    ),
]
REPO = Path(__file__).resolve().parent.parent
CALC = next(f for f in FIXTURES if f.name == "mini-calc-1")
FIX = {"tool": "write_file", "args": {"path": "mini/calc.py", "content": CALC.gold["mini/calc.py"]}}
# Busy while the runner restarts, then fixes the bug through a new model call (a new forwarder).
SLOW = {"main": [{"tool": "shell", "args": {"command": "sleep 10"}}, FIX, {"final": "fixed mul"}]}
ACTIVE = (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING)


async def runner(
    settings: RunnerSettings, kernel: KernelSettings
) -> AsyncIterator[runner_pb2_grpc.RunnerServiceStub]:
    host, _ = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        yield runner_pb2_grpc.RunnerServiceStub(channel)
    finally:
        await channel.close()
        await host.stop()  # a graceful stop: the harnesses run on in their containers


async def state_of(stub: runner_pb2_grpc.RunnerServiceStub, execution_id: str) -> runner_pb2.Execution:
    get = runner_pb2.GetExecutionRequest(execution_id=execution_id)
    return (await stub.GetExecution(get)).execution


async def test_a_runner_restart_reattaches_a_live_container_and_fails_a_gone_one_as_lost(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    await asyncio.to_thread(build_base, DEFAULT_BASE)
    await asyncio.to_thread(build_image, CALC)
    folder = write_task(CALC, tmp_path)
    model = ScriptedModel(script=SLOW)
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8], proxy_base_url=model.start()
    )
    kept, gone = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        first = runner(settings, kernel)
        stub = await anext(first)
        for eid in (kept, gone):
            ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=eid)
            await stub.StartExecution(
                runner_pb2.StartExecutionRequest(
                    request_id=f"r-{eid[:8]}",
                    execution=ref,
                    harness="gyre-agent",
                    family="swebench",
                    task=str(folder),
                    prompt="fix it",
                    timeout_s=120.0,
                )
            )
        for _ in range(600):  # bounded: both running within two minutes
            states = [(await state_of(stub, e)).state for e in (kept, gone)]
            if all(s == runner_pb2.EXECUTION_STATE_RUNNING for s in states):
                break
            await asyncio.sleep(0.2)
        assert all(s == runner_pb2.EXECUTION_STATE_RUNNING for s in states), states
        await first.aclose()  # the runner stops; both containers run on
        engine = find_engine() or []
        rm = [*engine, "rm", "-f", "-t", "0", f"gyre-run-{gone}"]
        assert (await asyncio.to_thread(subprocess.run, rm, capture_output=True)).returncode == 0

        second = runner(settings, kernel)
        stub = await anext(second)
        try:
            for _ in range(900):  # bounded: the harness's sleep, its fix and three minutes
                ended = {e: await state_of(stub, e) for e in (kept, gone)}
                if all(x.state not in ACTIVE for x in ended.values()):
                    break
                await asyncio.sleep(0.2)
            assert ended[gone].state == runner_pb2.EXECUTION_STATE_FAILED, ended[gone]
            assert ended[gone].failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_RUNNER_LOST
            assert "gone" in ended[gone].failure.reason
            # The gone container's workdir disk is unmounted and deleted, not left behind.
            assert not WorkDisk(f"gyre-run-{gone}").mounted()
            assert not WorkDisk(f"gyre-run-{gone}").image.exists()
            assert ended[kept].state == runner_pb2.EXECUTION_STATE_FINISHED, ended[kept]
            workspace = Path(ended[kept].workspace_uri.removeprefix("file://"))
            diff = (workspace / "agent.diff").read_text()
            assert "+    return a * b" in diff  # the fix made after the restart is in its diff
        finally:
            await second.aclose()
    finally:
        model.stop()
        for eid in (kept, gone):
            rm = [*(find_engine() or []), "rm", "-f", "-t", "0", f"gyre-run-{eid}"]
            await asyncio.to_thread(subprocess.run, rm, capture_output=True)
        # The kept execution's workspace was never released (no evaluator here): its disk too.
        await sweep_disks(owner_label(settings.sandbox_root))
        shutil.rmtree(settings.sandbox_root, ignore_errors=True)
