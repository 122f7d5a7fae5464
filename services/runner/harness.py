"""Harness adapters: the command and environment that start each harness (pure).

Every adapter points its harness at the proxy (as the sandbox sees it) with the execution's
token, and says which calls are main, sub-agent or summary where the harness lets it.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from dataclasses import dataclass


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


def _gyre_agent(i: HarnessInput) -> LaunchPlan:
    # The agent itself sets X-Gyre-Agent-Role / X-Gyre-Agent-Id on every call (main, sub, summary).
    return LaunchPlan(
        argv=(i.python, "-m", "services.runner.agent"),
        env={"OPENAI_BASE_URL": f"{i.base_url}/v1", "OPENAI_API_KEY": i.token, "GYRE_AGENT_MODEL": i.model},
    )


def _claude_code(i: HarnessInput) -> LaunchPlan:
    # Claude Code's sub-agents and compaction happen inside it with one set of headers, so it only
    # names itself; the proxy tells main/sub/summary apart from the requests.
    return LaunchPlan(
        argv=(
            "/bin/sh",
            "-c",
            'exec claude -p --output-format json --dangerously-skip-permissions < "$GYRE_PROMPT_FILE"',
        ),
        env={
            "ANTHROPIC_BASE_URL": i.base_url,
            "ANTHROPIC_API_KEY": i.token,
            "ANTHROPIC_MODEL": i.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
            "ANTHROPIC_CUSTOM_HEADERS": "X-Gyre-Agent-Id: claude-code",
        },
    )


def _mini_swe_agent(i: HarnessInput) -> LaunchPlan:
    # mini-swe-agent has one linear context and no sub-agents: every call is a main call.
    model = shlex.quote(f"openai/{i.model}")
    return LaunchPlan(
        argv=("/bin/sh", "-c", f'exec mini -y --exit-immediately -m {model} -t "$(cat "$GYRE_PROMPT_FILE")"'),
        env={
            "OPENAI_API_BASE": f"{i.base_url}/v1",  # litellm's api_base for `openai/` models
            "OPENAI_BASE_URL": f"{i.base_url}/v1",
            "OPENAI_API_KEY": i.token,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
        },
    )


ADAPTERS = {"gyre-agent": _gyre_agent, "claude-code": _claude_code, "mini-swe-agent": _mini_swe_agent}
HARNESSES = frozenset(ADAPTERS)


def plan_launch(harness: str, i: HarnessInput) -> LaunchPlan:
    """The harness command and its full environment; the runner's variables win over extra_env.

    Example:
        plan_launch("gyre-agent", HarnessInput(base_url="http://127.0.0.1:18080", token="t", ...))
        -> LaunchPlan(argv=(python, "-m", "services.runner.agent"),
                      env={..., "OPENAI_BASE_URL": "http://127.0.0.1:18080/v1", "OPENAI_API_KEY": "t"})
    """
    plan = ADAPTERS[harness](i)
    env = {
        "PATH": f"{posixpath.dirname(i.python)}:{DEFAULT_PATH}",
        **i.extra_env,
        **plan.env,
        "GYRE_PROMPT_FILE": i.prompt_file,
    }
    return LaunchPlan(argv=plan.argv, env=env)
