"""The agent loop: ask the model, run its tool calls, compact, delegate (shell)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

from services.runner.agent.client import ChatClient
from services.runner.agent.context import Budget, compacted, should_compact, summary_prompt
from services.runner.agent.tools import DELEGATE, SCHEMAS, Workspace

SYSTEM = (
    "You are a careful software engineer working in a repository. Use the tools to inspect files, "
    "write code and run the tests. When the task is done, answer with a short final message and "
    "no tool call."
)


@dataclass(slots=True, kw_only=True)
class AgentRun:
    """One agent (main or sub) with its own context; sub-agents share the counters of the run."""

    client: ChatClient
    workspace: Workspace
    budget: Budget
    max_turns: int
    max_depth: int = 1
    counters: dict[str, int] = field(default_factory=lambda: {"calls": 0, "subs": 0, "compactions": 0})
    out_of_turns: bool = False
    """The main agent used all `max_turns` turns without a final answer (a sub-agent's limit only
    ends the sub-agent): its budget ran out before the work was declared done."""

    def run(self, task: str, *, role: str = "main", agent_id: str = "main", depth: int = 0) -> str:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": task},
        ]
        tools = SCHEMAS + ([DELEGATE] if depth < self.max_depth else [])
        for _ in range(self.max_turns):
            if should_compact(messages, budget=self.budget):
                messages = self._compact(messages, agent_id=agent_id)
            reply = self.client.complete(messages, role=role, agent_id=agent_id, tools=tools)
            self.counters["calls"] += 1
            calls = reply.get("tool_calls") or []
            messages.append(
                {k: v for k, v in reply.items() if k in ("role", "content", "tool_calls")}
                | {"role": "assistant"}
            )
            if not calls:
                return str(reply.get("content") or "")
            for call in calls:
                fn = call.get("function", {})
                result = self.workspace.dispatch(
                    str(fn.get("name", "")),
                    str(fn.get("arguments", "")),
                    delegate=lambda sub_task: self._delegate(sub_task, depth=depth),
                )
                messages.append({"role": "tool", "tool_call_id": call.get("id", ""), "content": result})
        if depth == 0:
            self.out_of_turns = True
        return "stopped: turn limit reached"

    def _compact(self, messages: list[dict[str, Any]], *, agent_id: str) -> list[dict[str, Any]]:
        reply = self.client.complete(summary_prompt(messages), role="summary", agent_id=agent_id)
        self.counters["calls"] += 1
        self.counters["compactions"] += 1
        return compacted(messages, summary=str(reply.get("content") or ""))

    def _delegate(self, task: str, *, depth: int) -> str:
        self.counters["subs"] += 1
        sub_id = f"sub-{self.counters['subs']}"
        answer = self.run(task, role="sub", agent_id=sub_id, depth=depth + 1)
        return f"sub-agent {sub_id} answered: {answer}"


def report(run: AgentRun, answer: str) -> None:
    print(json.dumps({"final": answer[:2000], **run.counters}), file=sys.stdout, flush=True)
