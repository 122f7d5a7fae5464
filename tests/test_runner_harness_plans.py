"""The harness adapters' launch plans and sandbox limits (services/runner/harness.py, pure)."""

from __future__ import annotations

import subprocess
from dataclasses import replace

import pytest

from gyre.sandbox.limits import SandboxLimits
from services.runner.agent.__main__ import OUT_OF_TURNS_EXIT
from services.runner.harness import (
    DEFAULT_PATH,
    HARNESSES,
    HarnessInput,
    limits_for,
    plan_launch,
    spent_own_budget,
)


def harness_input(**extra_env: str) -> HarnessInput:
    return HarnessInput(
        base_url="http://127.0.0.1:18080", token="tok", prompt_file="/s/home/prompt.md",
        python="/v/bin/python", model="gyre-policy", extra_env=extra_env,
    )  # fmt: skip


def test_claude_code_sends_no_agent_header_so_the_proxy_tells_its_sub_agents_apart() -> None:
    env = plan_launch("claude-code", harness_input()).env
    assert not any("x-gyre-agent" in value.lower() for value in env.values()), env
    assert "ANTHROPIC_CUSTOM_HEADERS" not in env
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:18080"
    for name in ("API_TIMEOUT_MS", "CLAUDE_STREAM_IDLE_TIMEOUT_MS", "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS"):
        assert env[name] == "3600000", name  # the deadline: a slow first call is never sent twice


def test_runtime_folders_lead_the_harness_path() -> None:
    plan = plan_launch("claude-code", replace(harness_input(), runtime=("/opt/claude",)))
    assert plan.env["PATH"] == f"/opt/claude:/v/bin:{DEFAULT_PATH}"


def test_claude_codes_sandbox_gets_the_address_space_its_runtime_needs() -> None:
    small = SandboxLimits(memory_mb=1024)
    assert limits_for("claude-code", small).rlimits()["RLIMIT_AS"][0] == 8192 << 20
    assert limits_for("claude-code", small).memory_mb == 1024  # resident memory stays bounded
    roomy = SandboxLimits(memory_mb=1024, address_space_mb=16384)
    assert limits_for("claude-code", roomy) == roomy  # never lowered
    assert limits_for("gyre-agent", small) == small
    assert limits_for("mini-swe-agent", small) == small


def _argv_seen(harness: str, **extra_env: str) -> list[str]:
    """The argv the harness's shell line would exec, with `printf` standing in for the harness."""
    plan = plan_launch(harness, harness_input(**extra_env))
    line = plan.argv[2].replace("exec claude ", "exec printf '%s\\n' claude ")
    line = line.replace("exec mini ", "exec printf '%s\\n' mini ").replace('< "$GYRE_PROMPT_FILE"', "")
    env = {**plan.env, "GYRE_PROMPT_FILE": "/dev/null", "HOME": "/h"}
    out = subprocess.run(["/bin/sh", "-c", line], env=env, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


@pytest.mark.parametrize("harness", sorted(HARNESSES - {"gyre-agent"}))
def test_unbounded_harnesses_get_no_bound_flags(harness: str) -> None:
    argv = _argv_seen(harness)
    assert "--max-turns" not in argv and "--tools" not in argv
    assert not any("max_tokens" in a for a in argv)
    if harness == "mini-swe-agent":
        assert "agent.step_limit=0" in argv


def test_bounds_reach_claude_code_in_its_own_terms() -> None:
    argv = _argv_seen("claude-code", GYRE_HARNESS_MAX_TURNS="3", GYRE_HARNESS_MAX_OUTPUT_TOKENS="32")
    assert argv[argv.index("--max-turns") + 1] == "3"
    plan = plan_launch("claude-code", harness_input(GYRE_HARNESS_MAX_OUTPUT_TOKENS="32"))
    line = plan.argv[2].split("exec ")[0] + 'echo "$CLAUDE_CODE_MAX_OUTPUT_TOKENS"'
    out = subprocess.run(["/bin/sh", "-c", line], env=plan.env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "32"


def test_a_restricted_tool_set_reaches_claude_code_as_its_tools_flag() -> None:
    argv = _argv_seen("claude-code", GYRE_CLAUDE_CODE_TOOLS="Bash,Read,Edit,Write,Agent")
    assert argv[argv.index("--tools") + 1] == "Bash,Read,Edit,Write,Agent"


def test_bounds_reach_mini_swe_agent_in_its_own_terms() -> None:
    argv = _argv_seen("mini-swe-agent", GYRE_HARNESS_MAX_TURNS="3", GYRE_HARNESS_MAX_OUTPUT_TOKENS="32")
    assert "agent.step_limit=3" in argv
    assert "model.model_kwargs.max_tokens=32" in argv
    assert argv[argv.index("-m") + 1] == "openai/gyre-policy"


def test_only_the_built_in_agents_own_out_of_turns_exit_is_a_timeout() -> None:
    assert spent_own_budget("gyre-agent", OUT_OF_TURNS_EXIT)
    assert not spent_own_budget("gyre-agent", 0) and not spent_own_budget("gyre-agent", 3)
    # other harnesses declare no budget exit: a 124 from them is a crash like any other code
    assert not spent_own_budget("claude-code", OUT_OF_TURNS_EXIT)
    assert not spent_own_budget("mini-swe-agent", OUT_OF_TURNS_EXIT)
