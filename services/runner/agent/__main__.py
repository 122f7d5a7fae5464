"""`python -m services.runner.agent`: run the built-in agent on the task in $GYRE_PROMPT_FILE (shell).

Environment: OPENAI_BASE_URL, OPENAI_API_KEY (set by the runner: the proxy and the execution
token), GYRE_AGENT_MODEL, GYRE_AGENT_MAX_TURNS, GYRE_AGENT_CONTEXT_TOKENS, GYRE_AGENT_MAX_TOKENS,
GYRE_AGENT_MAX_DEPTH, GYRE_AGENT_TEMPERATURE, GYRE_AGENT_RETRY_S (how long a failing model endpoint
is retried before giving up, default 600). Exit code 0 when the agent finished, 3 when the model
endpoint failed, 124 (`timeout`'s code) when the main agent spent its turn budget
(GYRE_AGENT_MAX_TURNS) without a final answer: the runner ends that execution as timed out
(`harness.Harness.budget_exit_code`), graded for the partial credit its workspace earns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from services.runner.agent.client import DEFAULT_RETRY_S, ChatClient, ModelError
from services.runner.agent.context import Budget
from services.runner.agent.loop import AgentRun, report
from services.runner.agent.tools import Workspace

OUT_OF_TURNS_EXIT = 124


def main() -> int:
    env = os.environ
    try:
        task = Path(env["GYRE_PROMPT_FILE"]).read_text()
        client = ChatClient(
            base_url=env["OPENAI_BASE_URL"],
            api_key=env["OPENAI_API_KEY"],
            model=env.get("GYRE_AGENT_MODEL", "gyre-policy"),
            max_tokens=int(env.get("GYRE_AGENT_MAX_TOKENS", "1024")),
            temperature=float(env["GYRE_AGENT_TEMPERATURE"]) if env.get("GYRE_AGENT_TEMPERATURE") else None,
            retry_s=float(env.get("GYRE_AGENT_RETRY_S", str(DEFAULT_RETRY_S))),
        )
        run = AgentRun(
            client=client,
            workspace=Workspace(Path.cwd()),
            budget=Budget(context_tokens=int(env.get("GYRE_AGENT_CONTEXT_TOKENS", "24000"))),
            max_turns=int(env.get("GYRE_AGENT_MAX_TURNS", "50")),
            max_depth=int(env.get("GYRE_AGENT_MAX_DEPTH", "1")),
        )
    except (KeyError, ValueError, OSError) as exc:
        print(f"gyre-agent: bad configuration: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    try:
        answer = run.run(task)
    except ModelError as exc:
        print(f"gyre-agent: {exc}", file=sys.stderr)
        report(run, f"model failed: {exc}")
        return 3
    report(run, answer)
    return OUT_OF_TURNS_EXIT if run.out_of_turns else 0


if __name__ == "__main__":
    sys.exit(main())
