"""Real harnesses through the runner: Claude Code and mini-swe-agent start in their sandboxes on a
bundled task, call the model through the proxy, end within their bounds, and their calls land in
the trajectory service's tree with the right agent roles and ids.

The tiny torch model writes nonsense, so with it the harnesses cannot use a tool: the tests check
that the real prompts (Claude Code's first is ~53k tokens) are served and recorded. A sub-agent
needs the model to call Claude Code's Agent tool, so that test scripts the engine's words
(bench/scripted_engine.py) and keeps everything else real.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from harness_install import REPO_ROOT, install_claude_code, mini_swe_agent
from proxy_support import Rig, start_rig

from gyre.common.v1 import ids_pb2
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import runner_pb2, runner_pb2_grpc
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.runner.config import RunnerSettings
from services.runner.harness import DEFAULT_PATH
from services.runner.main import build_with_supervisor

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow, pytest.mark.e2e]
TASK = "csvsum"
PROMPT = "data.csv has columns name,amount. Write total.txt holding the sum of the amount column."


@dataclass
class Stack:
    rig: Rig
    runner: runner_pb2_grpc.RunnerServiceStub
    trajectory: trajectory_pb2_grpc.TrajectoryServiceStub

    async def run(self, harness: str, *, timeout_s: float, env: dict[str, str]) -> runner_pb2.Execution:
        """Start `harness` on the bundled task and wait for its end (bounded by its deadline)."""
        request = runner_pb2.StartExecutionRequest(
            request_id=f"start-{uuid.uuid4().hex[:8]}",
            execution=ids_pb2.ExecutionRef(task_id=str(uuid.uuid4()), execution_id=str(uuid.uuid4())),
            harness=harness,
            prompt=PROMPT,
            workspace_template=f"task:{TASK}",
            timeout_s=timeout_s,
            family="terminal",
            harness_env=env,
        )
        await self.runner.StartExecution(request)
        get = runner_pb2.GetExecutionRequest(execution_id=request.execution.execution_id)
        for _ in range(int(timeout_s + 120) * 2):  # bounded: the deadline, then the token's revocation
            ex = (await self.runner.GetExecution(get)).execution
            if ex.state not in (runner_pb2.EXECUTION_STATE_STARTING, runner_pb2.EXECUTION_STATE_RUNNING):
                return ex
            await asyncio.sleep(0.5)
        raise AssertionError(f"{harness} never ended")

    async def tree(self, execution_id: str, *, num_calls: int) -> trajectory_pb2.ExecutionTree:
        """The execution's tree once the trajectory service stored all `num_calls` calls."""
        request = trajectory_pb2.GetExecutionTreeRequest(execution_id=execution_id)
        tree = trajectory_pb2.ExecutionTree()
        for _ in range(200):  # bounded: 20 s for the consumer to catch up
            with contextlib.suppress(grpc.aio.AioRpcError):
                tree = (await self.trajectory.GetExecutionTree(request)).tree
                if len(tree.calls) >= num_calls:
                    return tree
            await asyncio.sleep(0.1)
        raise AssertionError(f"the tree has {len(tree.calls)} of {num_calls} calls")


@contextlib.asynccontextmanager
async def stack(
    kernel: KernelSettings, model_dir: Path, *, torch: bool, runtime: list[str]
) -> AsyncIterator[Stack]:
    """Proxy, trajectory service and runner (real sandboxes) in front of one engine: the tiny
    model on torch, or a scripted engine (`torch=False`) whose words `rig.scripter` chooses."""
    from services.trajectory.config import TrajectorySettings
    from services.trajectory.main import build as build_trajectory

    rig = await start_rig(kernel, model_dir, num_engines=0 if torch else 1)
    engine = await start_torch_engine(model_dir, kernel, rig) if torch else None
    trajectory = await build_trajectory(TrajectorySettings(port=0), kernel)
    await trajectory.start()
    path = ":".join([*runtime, str(Path(sys.executable).parent), DEFAULT_PATH])
    settings = RunnerSettings(
        sandbox_root=REPO_ROOT / ".gyre" / "test-sandboxes" / uuid.uuid4().hex[:8],
        proxy_address=rig.proxy.host.address,
        proxy_base_url=rig.http_url,
        sandbox_runtime=runtime,
        harness_env={"PATH": path},
        memory_mb=2048,
        disk_mb=256,
    )
    runner, supervisor = await build_with_supervisor(settings, kernel)
    await runner.start()
    channels = [grpc.aio.insecure_channel(runner.address), grpc.aio.insecure_channel(trajectory.address)]
    try:
        yield Stack(
            rig=rig,
            runner=runner_pb2_grpc.RunnerServiceStub(channels[0]),
            trajectory=trajectory_pb2_grpc.TrajectoryServiceStub(channels[1]),
        )
    finally:
        for channel in channels:
            await channel.close(None)
        await runner.stop()
        if not os.environ.get("GYRE_KEEP_SANDBOXES"):
            supervisor.host.sweep()
            supervisor.host.root.rmdir()
        await trajectory.stop(grace_s=1)
        if engine is not None:
            await engine.stop(grace_s=1)
        await rig.close()


async def start_torch_engine(model_dir: Path, kernel: KernelSettings, rig: Rig) -> ServiceHost:
    from services.engine.config import EngineSettings
    from services.engine.main import build

    settings = EngineSettings(
        model_dir=model_dir, engine_id="torch-h", cell_id="cell-h", publish_events=False,
        init_model_if_missing=False,
    )  # fmt: skip
    host = await build(settings, kernel)
    await host.start()
    await rig.stub.RegisterEngine(
        proxy_pb2.RegisterEngineRequest(
            request_id=f"torch-h-{uuid.uuid4().hex[:6]}", cell_id="cell-h", engine_id="torch-h",
            address=host.address,
        )
    )  # fmt: skip
    return host


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model"))


def claude_code_script(prompt: str) -> str:
    """Claude Code's main agent runs Bash, starts a sub-agent (the Agent tool), then ends."""
    if "cc_is_subagent=true" in prompt or "You are an agent for Claude Code" in prompt:
        return "Sub done."
    if "<tool_response>" not in prompt:
        bash = '{"command": "echo 6 > total.txt", "description": "write"}'
        return f'<tool_call>{{"name": "Bash", "arguments": {bash}}}</tool_call>'
    if "Sub done." not in prompt:
        task = '{"description": "look", "prompt": "List the files here", "subagent_type": "general-purpose"}'
        return f'<tool_call>{{"name": "Agent", "arguments": {task}}}</tool_call>'
    return "Done."


async def test_claude_code_in_the_sandbox_gives_its_sub_agent_an_agent_id_of_its_own(
    kernel: KernelSettings, tiny_model: Path
) -> None:
    claude = install_claude_code()
    async with stack(kernel, tiny_model, torch=False, runtime=[str(claude.parent)]) as s:
        s.rig.scripter.rule = claude_code_script
        ended = await s.run("claude-code", timeout_s=300, env={"GYRE_HARNESS_MAX_TURNS": "6"})
        assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended
        assert (Path(ended.workspace_uri.removeprefix("file://")) / "total.txt").read_text() == "6\n"
        tree = await s.tree(ended.execution.execution_id, num_calls=4)
    agents = [(c.agent_role, c.agent_id) for c in tree.calls]
    assert agents[:2] == [("main", "main")] * 2, agents
    subs = {agent_id for role, agent_id in agents if role == "sub"}
    assert len(subs) == 1 and subs.pop().startswith("sub-"), agents
    assert agents[-1] == ("main", "main"), agents
    by_agent = {(t.agent_role, t.agent_id) for t in tree.trajectories}
    assert ("main", "main") in by_agent and any(role == "sub" for role, _ in by_agent)
    assert min(c.num_prompt_tokens for c in tree.calls if c.agent_role == "main") > 40_000


async def test_mini_swe_agent_calls_the_tiny_model_in_the_sandbox_until_its_step_limit(
    kernel: KernelSettings, tiny_model: Path
) -> None:
    """The tiny model's words are no tool call, so mini-swe-agent answers each with a format error
    and drops the reply: every call branches off the previous call's prompt, all main calls."""
    mini_swe_agent()
    env = {"GYRE_HARNESS_MAX_TURNS": "3", "GYRE_HARNESS_MAX_OUTPUT_TOKENS": "16"}
    async with stack(kernel, tiny_model, torch=True, runtime=[]) as s:
        ended = await s.run("mini-swe-agent", timeout_s=600, env=env)
        assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended  # LimitsExceeded exits 0
        tree = await s.tree(ended.execution.execution_id, num_calls=3)
    assert [(c.agent_role, c.agent_id) for c in tree.calls] == [("main", "main")] * 3
    assert [c.num_output_tokens for c in tree.calls] == [16] * 3
    assert len(tree.trajectories) == 3
    for before, after in itertools.pairwise(tree.calls):
        # all of the previous prompt but its generation prompt `<|im_start|>assistant\n`
        assert after.num_shared_prompt_tokens == before.num_prompt_tokens - 3, tree
    for before, after in itertools.pairwise(tree.trajectories):
        assert after.shared_prefix_with == before.trajectory_id
