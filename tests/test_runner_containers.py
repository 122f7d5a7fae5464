"""The runner runs a container task's harness in the task's own image, against the model through
the forwarder, and exports the agent's diff that the evaluator grades (live: Podman, NATS, Postgres)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from pathlib import Path

import grpc
import pytest

from bench.dataset_fixtures import FIXTURES, build_image, write_task
from bench.scripted_model import ScriptedModel
from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.settings import KernelSettings
from gyre_app.images import DEFAULT_BASE, build_base
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import load_container_task
from services.runner.config import RunnerSettings
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
SCRIPT = {
    "main": [
        {"tool": "shell", "args": {"command": "git log --all --format=%s > /tmp/history.txt; pwd"}},
        {"tool": "write_file", "args": {"path": "mini/calc.py", "content": CALC.gold["mini/calc.py"]}},
        {"final": "fixed mul"},
    ]
}


async def test_the_agent_fixes_the_task_in_its_image_and_the_diff_resolves_it(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    await asyncio.to_thread(build_base, DEFAULT_BASE)
    await asyncio.to_thread(build_image, CALC)
    folder = write_task(CALC, tmp_path)
    model = ScriptedModel(script=SCRIPT)
    url = model.start()
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8], proxy_base_url=url
    )
    host, supervisor = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        stub = runner_pb2_grpc.RunnerServiceStub(channel)
        ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
        request = runner_pb2.StartExecutionRequest(
            request_id=f"c-{uuid.uuid4().hex[:8]}", execution=ref, harness="gyre-agent", family="swebench",
            task=str(folder), prompt=CALC.prompt, timeout_s=120.0,
        )  # fmt: skip
        await stub.StartExecution(request)
        ended = None
        for _ in range(600):  # bounded: 120 s
            ended = (
                await stub.GetExecution(runner_pb2.GetExecutionRequest(execution_id=ref.execution_id))
            ).execution
            if ended.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING):
                break
            await asyncio.sleep(0.2)
        assert ended is not None and ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended
        workspace = Path(ended.workspace_uri.removeprefix("file://"))
        diff = (workspace / "agent.diff").read_bytes()
        log = (workspace / "agent.log").read_text()
        await supervisor.release(ref.execution_id)  # graded from the copy: the container goes
        exists = [*(find_engine() or []), "container", "exists", f"gyre-run-{ref.execution_id}"]
        assert (await asyncio.to_thread(subprocess.run, exists)).returncode == 1
        assert not await asyncio.to_thread(workspace.exists)
        graded = await ContainerGrader(OciBackend()).grade(load_container_task(folder), diff, agent_log=log)
    finally:
        await channel.close()
        await host.stop()
        model.stop()
        shutil.rmtree(settings.sandbox_root, ignore_errors=True)
    assert b"mini/calc.py" in diff and b"tests/" not in diff
    assert "git log --all --format=%s" in log  # the git shim noted the history command
    assert {s.token for s in model.seen} and all(s.role == "main" for s in model.seen)
    assert (graded.scored.score, graded.scored.assessable) == (1.0, True), graded.scored
    assert graded.signals == ("agent ran git history commands: git log",)
