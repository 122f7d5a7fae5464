"""Real harnesses through the proxy: the Claude Code CLI and mini-swe-agent run a tool loop
against scripted engine outputs (the tiny model's words are nonsense); the calls are recorded
token-in/token-out with delta prompts that reuse the engine's output ids.

Claude Code is installed once into `.gyre/harnesses/` (tests/harness_install.py; skipped with
the reason where npm is missing), mini-swe-agent comes with the dev extra. If an install cannot
work, the test fails loudly.
"""

from __future__ import annotations

import asyncio
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from harness_install import install_claude_code
from harness_install import mini_swe_agent as mini_command
from proxy_support import Rig, prompt_of, start_rig, write_tokenizer

from gyre.proxy.v1 import proxy_pb2
from gyre.settings import KernelSettings

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow, pytest.mark.e2e]


@pytest.fixture(scope="session")
def claude_code() -> Path:
    return install_claude_code()


@pytest.fixture(scope="session")
def mini_swe_agent() -> Path:
    return mini_command()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rig(kernel: KernelSettings, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    model_dir = write_tokenizer(tmp_path_factory.mktemp("harness-tokenizer"))
    # Claude Code's system prompt and tools are ~50k tokens of the tiny vocabulary: a scripted
    # engine does not mind a long context.
    rig = await start_rig(kernel, model_dir, num_engines=1, context_window_tokens=1_000_000)
    yield rig
    await rig.close()


def _check_chain(records: list[proxy_pb2.CallRecord]) -> None:
    """Each later call extends the previous one's prompt + output with the engine's exact ids."""
    by_id = {r.call_id: r for r in records}
    for before, after in itertools.pairwise(records):
        assert after.prompt_delta.parent_call_id == before.call_id
        context = [*prompt_of(before, by_id), *before.output_ids]
        got = prompt_of(after, by_id)[: len(context)]
        assert got == context


async def test_claude_code_runs_a_tool_loop_and_a_sub_agent_through_the_proxy(
    rig: Rig, claude_code: Path, tmp_path: Path
) -> None:
    """Main agent: Bash tool, then a sub-agent (the Agent tool, formerly Task), then done; one CLI
    run (its start is slow). The tool is called by its current name: Claude Code sends an old
    name back renamed, which is a different context (a new branch), not a continuation."""
    bash = '{"command": "echo hello > out.txt", "description": "write"}'
    task = '{"description": "look", "prompt": "List the files here", "subagent_type": "general-purpose"}'

    def rule(prompt: str) -> str:
        if "cc_is_subagent=true" in prompt or "You are an agent for Claude Code" in prompt:
            return "Sub done."
        if "<tool_response>" not in prompt:
            return f'<tool_call>{{"name": "Bash", "arguments": {bash}}}</tool_call>'
        if "Sub done." not in prompt:
            return f'<tool_call>{{"name": "Agent", "arguments": {task}}}</tool_call>'
        return "Done."

    rig.scripter.rule = rule
    token, execution_id = await rig.register_execution()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path / "home"),
        "ANTHROPIC_BASE_URL": rig.http_url,
        "ANTHROPIC_API_KEY": token,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    argv = [str(claude_code), "-p", "write hello into out.txt", "--allowedTools", "Bash", "Agent"]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        "--output-format",
        "json",
        cwd=tmp_path,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        rig.scripter.rule = None
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, (out + err).decode()[-3000:]
    assert (tmp_path / "out.txt").read_text().strip() == "hello"
    assert b'"result":"Done."' in out
    records = await rig.records(execution_id, at_least=4)
    main = [r for r in records if r.agent_role == proxy_pb2.AGENT_ROLE_MAIN]
    subs = [r for r in records if r.agent_role == proxy_pb2.AGENT_ROLE_SUB]
    assert len(main) == 3, [(r.agent_role, r.agent_id) for r in records]
    assert len(subs) >= 1 and len({r.agent_id for r in subs}) == 1 and subs[0].agent_id.startswith("sub-")
    _check_chain(main)


async def test_mini_swe_agent_runs_a_tool_loop_through_the_proxy(
    rig: Rig, mini_swe_agent: Path, tmp_path: Path
) -> None:
    def rule(prompt: str) -> str:
        command = (
            "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
            if "<tool_response>" in prompt
            else "echo hi > out.txt"
        )
        return (
            f'Running it.<tool_call>{{"name": "bash", "arguments": {{"command": "{command}"}}}}</tool_call>'
        )

    rig.scripter.rule = rule
    token, execution_id = await rig.register_execution()
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path / "home"),
        "MSWEA_CONFIGURED": "true",
        "MSWEA_GLOBAL_CONFIG_DIR": str(tmp_path / "mswea"),
        "MSWEA_COST_TRACKING": "ignore_errors",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    argv = [
        str(mini_swe_agent),
        "-m",
        "openai/tiny",
        "-t",
        "write hi into out.txt",
        "--yolo",
        "--exit-immediately",
        "-c",
        "mini.yaml",
        "-c",
        f"model.model_kwargs.api_base={rig.http_url}/v1",
        "-c",
        f"model.model_kwargs.api_key={token}",
        "-o",
        str(tmp_path / "traj.json"),
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    finally:
        rig.scripter.rule = None
        if proc.returncode is None:
            proc.kill()
    assert proc.returncode == 0, out.decode()[-3000:]
    assert (tmp_path / "out.txt").read_text().strip() == "hi"
    records = await rig.records(execution_id, at_least=2)
    assert len(records) == 2 and all(r.agent_role == proxy_pb2.AGENT_ROLE_MAIN for r in records)
    _check_chain(records)
