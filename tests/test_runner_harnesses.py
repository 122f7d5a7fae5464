"""Real harnesses through the runner: Claude Code and mini-swe-agent start in their sandboxes on a
bundled task, call the model through the proxy, end within their bounds, and their calls land in
the trajectory service's tree with the right agent roles and ids.

The tiny torch model writes nonsense, so with it a harness cannot use a tool: mini-swe-agent runs
on it until its step limit. Claude Code's sub-agent needs the model to call its Agent tool, so that
test scripts the engine's words (bench/scripted_engine.py) and keeps everything else real, its
whole ~53k-token prompt included. Claude Code on the tiny torch model runs with a restricted
tool set (GYRE_CLAUDE_CODE_TOOLS): its tool definitions are most of its prompt, and with all of
them the first prompt takes minutes to prefill on 2 CPU cores (`python -m bench.harness_runs`).
The runner's sandboxes have 2 GiB (bench/harness_runs.py): Claude Code's runtime dies at start in
that address space, so its run also shows that its registry entry raises it.
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from harness_install import install_claude_code, mini_swe_agent
from proxy_support import Rig, start_rig

from bench.harness_runs import HarnessServices, harness_services
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import runner_pb2
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow, pytest.mark.e2e]


@contextlib.asynccontextmanager
async def stack(
    kernel: KernelSettings, model_dir: Path, *, torch: bool, runtime: list[str]
) -> AsyncIterator[tuple[Rig, HarnessServices]]:
    """Proxy, trajectory service and runner (real sandboxes) in front of one engine: the tiny
    model on torch, or a scripted engine (`torch=False`) whose words `rig.scripter` chooses."""
    rig = await start_rig(kernel, model_dir, num_engines=0 if torch else 1)
    engine = await start_torch_engine(model_dir, kernel, rig) if torch else None
    try:
        async with harness_services(
            kernel, proxy_address=rig.proxy.host.address, proxy_http_url=rig.http_url, runtime=runtime
        ) as services:
            yield rig, services
    finally:
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
    async with stack(kernel, tiny_model, torch=False, runtime=[str(claude.parent)]) as (rig, s):
        rig.scripter.rule = claude_code_script
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


CLAUDE_CODE_TOOLS = "Bash,Read,Edit,Write,Agent"


async def test_claude_code_with_a_restricted_tool_set_calls_the_tiny_model_in_the_sandbox(
    kernel: KernelSettings, tiny_model: Path
) -> None:
    """The tiny model samples nonsense: a reply that hits the output cap Claude Code retries 3
    times and then exits 1 (the runner ends it as a crashed harness); a reply that stops before
    the cap ends its one turn and it exits 0. Either way its calls are all main in the tree."""
    claude = install_claude_code()
    env = {"GYRE_HARNESS_MAX_TURNS": "1", "GYRE_HARNESS_MAX_OUTPUT_TOKENS": "16",
           "GYRE_CLAUDE_CODE_TOOLS": CLAUDE_CODE_TOOLS}  # fmt: skip
    async with stack(kernel, tiny_model, torch=True, runtime=[str(claude.parent)]) as (_, s):
        ended = await s.run("claude-code", timeout_s=600, env=env)
        if ended.state == runner_pb2.EXECUTION_STATE_FAILED:
            assert ended.failure.kind == runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED, ended
            assert ended.exit_code == 1, ended
        else:
            assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED and ended.exit_code == 0, ended
        tree = await s.tree(ended.execution.execution_id, num_calls=1)
    assert {(c.agent_role, c.agent_id) for c in tree.calls} == {("main", "main")}, tree
    assert all(c.num_output_tokens <= 16 for c in tree.calls), tree  # the cap reaches the engine
    for before, after in itertools.pairwise(tree.calls):  # each call extends the previous one
        assert after.num_shared_prompt_tokens > before.num_prompt_tokens - 16, tree
    # its own system prompt and 5 tools: about a fifth of the ~53k tokens of all 24 tools
    assert 5_000 < tree.calls[0].num_prompt_tokens < 20_000, tree.calls[0]


async def test_mini_swe_agent_calls_the_tiny_model_in_the_sandbox_until_its_step_limit(
    kernel: KernelSettings, tiny_model: Path
) -> None:
    """The tiny model's words are no tool call, so mini-swe-agent answers each with a format error
    and drops the reply: every call branches off the previous call's prompt, all main calls."""
    mini_swe_agent()
    env = {"GYRE_HARNESS_MAX_TURNS": "3", "GYRE_HARNESS_MAX_OUTPUT_TOKENS": "16"}
    async with stack(kernel, tiny_model, torch=True, runtime=[]) as (_, s):
        ended = await s.run("mini-swe-agent", timeout_s=600, env=env)
        assert ended.state == runner_pb2.EXECUTION_STATE_FINISHED, ended  # LimitsExceeded exits 0
        tree = await s.tree(ended.execution.execution_id, num_calls=3)
    assert [(c.agent_role, c.agent_id) for c in tree.calls] == [("main", "main")] * 3
    # the cap reaches the engine; the random model may sample its end-of-turn token before it
    outputs = [c.num_output_tokens for c in tree.calls]
    assert all(n <= 16 for n in outputs) and 16 in outputs, outputs
    assert len(tree.trajectories) == 3
    for before, after in itertools.pairwise(tree.calls):
        # all of the previous prompt but its generation prompt `<|im_start|>assistant\n`
        assert after.num_shared_prompt_tokens == before.num_prompt_tokens - 3, tree
    for before, after in itertools.pairwise(tree.trajectories):
        assert after.shared_prefix_with == before.trajectory_id
