"""Harness adapters: the command, environment and sandbox limits that start each harness (pure).

Every adapter points its harness at the proxy (as the sandbox sees it) with the execution's
token, and says which calls are main, sub-agent or summary where the harness lets it; where the
harness cannot (Claude Code), it sends no agent header and the proxy detects the agent from the
request (services/proxy/agents.py).
"""

from __future__ import annotations

import posixpath
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from gyre.sandbox.limits import SandboxLimits

if TYPE_CHECKING:  # the outcome's type only: this module stays free of the sandbox's I/O
    from gyre.sandbox.host import Outcome


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessInput:
    base_url: str
    """The proxy's HTTP root as the harness sees it, e.g. `http://127.0.0.1:18080`."""
    token: str
    prompt_file: str
    python: str
    """Interpreter that runs the built-in agent (the runner's own)."""
    model: str
    extra_env: Mapping[str, str]
    runtime: Sequence[str] = ()
    """Folders of harnesses installed outside /usr (the runner's `sandbox_runtime`): they lead PATH."""
    timeout_s: float = 3600.0
    """The execution's deadline: a harness waits that long for one model call (a long first
    prompt on a CPU engine takes minutes) rather than dropping it and asking again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchPlan:
    argv: tuple[str, ...]
    env: dict[str, str]


RESERVED_ENV = frozenset(
    {
        "OPENAI_BASE_URL",
        "OPENAI_API_BASE",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "GYRE_PROMPT_FILE",
        "HOME",
        "PATH",
    }
)
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# An execution may bound a harness through `harness_env` (executions.BOUNDS_ENV, positive
# integers); each adapter passes them on in its harness's own terms: GYRE_HARNESS_MAX_TURNS is
# Claude Code's `--max-turns` and mini-swe-agent's `agent.step_limit`, and
# GYRE_HARNESS_MAX_OUTPUT_TOKENS is CLAUDE_CODE_MAX_OUTPUT_TOKENS and litellm's `max_tokens`.
# GYRE_CLAUDE_CODE_TOOLS (e.g. `Bash,Read,Edit,Write,Agent`) is Claude Code's `--tools`, the
# built-in tools it offers the model: their definitions are most of its first prompt (about 64k
# of 77k characters with all 24), so a restricted set cuts the prefill. Unset: its defaults.
# The built-in agent has its own (`GYRE_AGENT_*`).


def _gyre_agent(i: HarnessInput) -> LaunchPlan:
    # The agent itself sets X-Gyre-Agent-Role / X-Gyre-Agent-Id on every call (main, sub, summary).
    return LaunchPlan(
        argv=(i.python, "-m", "services.runner.agent"),
        env={"OPENAI_BASE_URL": f"{i.base_url}/v1", "OPENAI_API_KEY": i.token, "GYRE_AGENT_MODEL": i.model},
    )


def _claude_code(i: HarnessInput) -> LaunchPlan:
    deadline_ms = str(max(1000, round(i.timeout_s * 1000)))
    # Claude Code's sub-agents and compaction happen inside it with one set of headers, so it sends
    # no X-Gyre-Agent-* header (one would override the proxy's detection and merge every
    # sub-agent into one agent id); the proxy tells main/sub/summary apart from the requests.
    return LaunchPlan(
        argv=(
            "/bin/sh",
            "-c",
            '[ -n "$GYRE_HARNESS_MAX_OUTPUT_TOKENS" ] && '
            'export CLAUDE_CODE_MAX_OUTPUT_TOKENS="$GYRE_HARNESS_MAX_OUTPUT_TOKENS"; '
            "exec claude -p --output-format json --dangerously-skip-permissions "
            '${GYRE_HARNESS_MAX_TURNS:+--max-turns "$GYRE_HARNESS_MAX_TURNS"} '
            '${GYRE_CLAUDE_CODE_TOOLS:+--tools "$GYRE_CLAUDE_CODE_TOOLS"} < "$GYRE_PROMPT_FILE"',
        ),
        env={
            "ANTHROPIC_BASE_URL": i.base_url,
            "ANTHROPIC_API_KEY": i.token,
            "ANTHROPIC_MODEL": i.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            # Its own defaults give up on a call after 5 minutes without a stream event (a long first
            # prompt on a CPU engine) and send it again from the start: wait up to the deadline.
            "API_TIMEOUT_MS": deadline_ms,
            "CLAUDE_STREAM_IDLE_TIMEOUT_MS": deadline_ms,
            "CLAUDE_BYTE_STREAM_IDLE_TIMEOUT_MS": deadline_ms,
        },
    )


def _mini_swe_agent(i: HarnessInput) -> LaunchPlan:
    # mini-swe-agent has one linear context and no sub-agents: every call is a main call.
    model = shlex.quote(f"openai/{i.model}")
    return LaunchPlan(
        argv=(
            "/bin/sh",
            "-c",
            f"exec mini -y --exit-immediately -m {model} -c mini.yaml "
            '-c "agent.step_limit=${GYRE_HARNESS_MAX_TURNS:-0}" '
            "${GYRE_HARNESS_MAX_OUTPUT_TOKENS:+-c "
            '"model.model_kwargs.max_tokens=$GYRE_HARNESS_MAX_OUTPUT_TOKENS"} '
            '-o "$HOME/mini-trajectory.json" -t "$(cat "$GYRE_PROMPT_FILE")"',
        ),
        env={
            "OPENAI_API_BASE": f"{i.base_url}/v1",  # litellm's api_base for `openai/` models
            "OPENAI_BASE_URL": f"{i.base_url}/v1",
            "OPENAI_API_KEY": i.token,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # the sandbox has no network to fetch it
        },
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Harness:
    """One harness the runner can start: its adapter and what its runtime needs of the sandbox."""

    plan: Callable[[HarnessInput], LaunchPlan]
    min_address_space_mb: int = 0
    """Address space per process (RLIMIT_AS) below which the runtime cannot start, whatever the
    runner's settings say; resident memory stays bounded by the memory cgroup (`memory_mb`)."""
    budget_exit_code: int | None = None
    """The exit code by which the harness says its own budget (turns) ran out before it declared
    the work done: the runner ends the execution as timed out, as at the wall-clock deadline,
    and the evaluator grades the workspace for partial credit. None: every non-zero exit is a crash."""


REGISTRY = {
    # services.runner.agent.__main__.OUT_OF_TURNS_EXIT (not imported: the agent runs in the sandbox).
    "gyre-agent": Harness(plan=_gyre_agent, budget_exit_code=124),
    # Claude Code's runtime (Bun) reserves gigabytes of address space it never touches: under
    # 2 GiB it dies at start with SIGILL, 4 GiB runs; 8 GiB leaves room for its worker threads.
    "claude-code": Harness(plan=_claude_code, min_address_space_mb=8192),
    "mini-swe-agent": Harness(plan=_mini_swe_agent),
}
HARNESSES = frozenset(REGISTRY)


def limits_for(harness: str, limits: SandboxLimits) -> SandboxLimits:
    """The runner's sandbox limits, with the address space raised to what the harness needs.

    Example:
        limits_for("claude-code", SandboxLimits(memory_mb=1024)) -> address_space_mb=8192, memory_mb=1024
        limits_for("gyre-agent", SandboxLimits(memory_mb=1024))  -> unchanged (address space 1024)
    """
    need = REGISTRY[harness].min_address_space_mb
    if need <= (limits.address_space_mb or limits.memory_mb):
        return limits
    return replace(limits, address_space_mb=need)


def spent_own_budget(harness: str, exit_code: int | None) -> bool:
    """Whether the harness's exit says its own budget ran out (a timeout, not a crash).

    Example: spent_own_budget("gyre-agent", 124) -> True; spent_own_budget("claude-code", 124) -> False
    """
    code = REGISTRY[harness].budget_exit_code
    return code is not None and exit_code == code


def plan_launch(harness: str, i: HarnessInput) -> LaunchPlan:
    """The harness command and its full environment; the runner's variables win over extra_env.

    Example:
        plan_launch("gyre-agent", HarnessInput(base_url="http://127.0.0.1:18080", token="t", ...))
        -> LaunchPlan(argv=(python, "-m", "services.runner.agent"),
                      env={..., "OPENAI_BASE_URL": "http://127.0.0.1:18080/v1", "OPENAI_API_KEY": "t"})
    """
    plan = REGISTRY[harness].plan(i)
    env = {
        "PATH": ":".join([*i.runtime, posixpath.dirname(i.python), DEFAULT_PATH]),
        **i.extra_env,
        **plan.env,
        "GYRE_PROMPT_FILE": i.prompt_file,
    }
    return LaunchPlan(argv=plan.argv, env=env)


def crash_reason(outcome: Outcome, log_tail: str) -> str:
    """Why a started harness counts as crashed (pure).

    Example: crash_reason(Outcome(exit_code=139), "") -> "the harness died of signal 11 (SIGSEGV)"
    """
    if outcome.killed:
        why = f"the runner killed the harness: {outcome.killed.replace('_', ' ')} exceeded"
    elif outcome.exit_code is not None and outcome.exit_code > 128:
        sig = outcome.exit_code - 128
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = "unknown"
        why = f"the harness died of signal {sig} ({name})"
    else:
        why = f"the harness exited with code {outcome.exit_code}"
    return f"{why}; last output: {log_tail.strip()[-800:]}" if log_tail.strip() else why
