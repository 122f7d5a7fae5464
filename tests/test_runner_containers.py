"""The runner runs a container task's harness in the task's own image, against the model through
the forwarder, and exports the agent's diff that the evaluator grades (live: Podman, NATS, Postgres)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from bench.dataset_fixtures import FIXTURES, build_image, write_task
from bench.dataset_images import build_image as build_dataset_image
from bench.dataset_images import import_fixtures
from bench.scripted_model import ScriptedModel
from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.settings import KernelSettings
from gyre_app.images import DEFAULT_BASE, build_base
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import load_container_task
from services.evaluator.grading import Graded
from services.runner.config import RunnerSettings
from services.runner.main import build_with_supervisor
from services.runner.supervisor import Supervisor

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
SCRIPT = {
    "main": [
        {"tool": "shell", "args": {"command": "git log --all --format=%s > /tmp/history.txt; pwd"}},
        FIX,
        {"final": "fixed mul"},
    ]
}
# Fixes the bug, then hangs past the deadline: the work done so far is exported and graded.
SCRIPTS = {
    "hang": {"main": [FIX, {"tool": "shell", "args": {"command": "sleep 120"}}]},
    # Looks for the tests an R2E-Gym image carries, and notes what it found in the workspace.
    "peek": {
        "main": [
            {"tool": "shell", "args": {"command": "ls /root/r2e_tests > peek.txt 2>&1; echo $? >> peek.txt"}}
        ]
    },
}


@dataclass
class Rig:
    stub: runner_pb2_grpc.RunnerServiceStub
    supervisor: Supervisor
    model: ScriptedModel
    folder: Path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    await asyncio.to_thread(build_base, DEFAULT_BASE)
    await asyncio.to_thread(build_image, CALC)
    folder = write_task(CALC, tmp_path_factory.mktemp("container-runner"))
    model = ScriptedModel(script=SCRIPT, scripts=SCRIPTS)
    settings = RunnerSettings(
        sandbox_root=REPO / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8], proxy_base_url=model.start()
    )
    host, supervisor = await build_with_supervisor(settings, kernel)
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        yield Rig(runner_pb2_grpc.RunnerServiceStub(channel), supervisor, model, folder)
    finally:
        await channel.close()
        await host.stop()
        model.stop()
        shutil.rmtree(settings.sandbox_root, ignore_errors=True)


async def run_to_end(
    rig: Rig, *, prompt: str, timeout_s: float, folder: Path | None = None
) -> runner_pb2.Execution:
    ref = ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4()))
    request = runner_pb2.StartExecutionRequest(
        request_id=f"c-{uuid.uuid4().hex[:8]}", execution=ref, harness="gyre-agent", family="swebench",
        task=str(folder or rig.folder), prompt=prompt, timeout_s=timeout_s,
    )  # fmt: skip
    await rig.stub.StartExecution(request)
    get = runner_pb2.GetExecutionRequest(execution_id=ref.execution_id)
    for _ in range(int(timeout_s * 5) + 300):  # bounded: the deadline and a minute
        ended = (await rig.stub.GetExecution(get)).execution
        if ended.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING):
            return ended
        await asyncio.sleep(0.2)
    raise AssertionError(f"execution {ref.execution_id} never ended")


async def grade(
    rig: Rig, ended: runner_pb2.Execution, folder: Path | None = None
) -> tuple[bytes, str, Graded]:
    workspace = Path(ended.workspace_uri.removeprefix("file://"))
    diff = await asyncio.to_thread((workspace / "agent.diff").read_bytes)
    log = (await asyncio.to_thread((workspace / "agent.log").read_bytes)).decode()
    await rig.supervisor.release(ended.execution.execution_id)  # graded from the copy: the container goes
    exists = [*(find_engine() or []), "container", "exists", f"gyre-run-{ended.execution.execution_id}"]
    assert (await asyncio.to_thread(subprocess.run, exists)).returncode == 1
    assert not await asyncio.to_thread(workspace.exists)
    task = load_container_task(folder or rig.folder)
    graded = await ContainerGrader(OciBackend()).grade(task, diff, agent_log=log)
    return diff, log, graded


async def test_the_agent_fixes_the_task_in_its_image_and_the_diff_resolves_it(rig: Rig) -> None:
    ended = await run_to_end(rig, prompt=CALC.prompt, timeout_s=120.0)
    assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended
    diff, log, graded = await grade(rig, ended)
    assert b"mini/calc.py" in diff and b"tests/" not in diff
    assert "git log --all --format=%s" in log  # the git shim noted the history command
    assert {s.token for s in rig.model.seen} and all(s.role == "main" for s in rig.model.seen)
    assert (graded.scored.score, graded.scored.assessable) == (1.0, True), graded.scored
    assert graded.signals == ("agent ran git history commands: git log",)


async def test_a_timed_out_agent_keeps_the_work_it_did_for_partial_credit(rig: Rig) -> None:
    ended = await run_to_end(rig, prompt="[script: hang] fix it", timeout_s=10.0)
    assert ended.state == runner_pb2.EXECUTION_STATE_TIMED_OUT, ended
    _, _, graded = await grade(rig, ended)
    assert graded.scored.score == 1.0


async def test_an_r2e_images_own_tests_are_hidden_from_the_agent_and_still_grade(
    rig: Rig, tmp_path: Path
) -> None:
    folders = await asyncio.to_thread(import_fixtures, tmp_path)
    folder = next(f for f in folders if f.name.startswith("stack__"))
    await asyncio.to_thread(build_dataset_image, load_container_task(folder))
    ended = await run_to_end(rig, prompt="[script: peek] fix it", timeout_s=60.0, folder=folder)
    assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended
    diff, _, graded = await grade(rig, ended, folder)
    # ls found nothing (gone, and /root is not the agent's to read), exit code 2
    assert b"/root/r2e_tests" in diff and b"+2" in diff and b"test_1.py" not in diff
    assert graded.scored.assessable and 0.0 < graded.scored.score < 1.0  # the tests ran at grading
