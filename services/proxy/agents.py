"""Say which agent of a harness made a call: main agent, sub-agent or compaction summary (pure).

The harness is a black box, so the role is read off the request itself. Explicit headers
(`X-Gyre-Agent-Role`, `X-Gyre-Agent-Id`, sent by Gyre's built-in agent) win over detection.

- Claude Code: a sub-agent started by the Task tool has a system prompt marked as a sub-agent's
  (see `_CLAUDE_CODE_SUB`), and its first user message is the task it was given, stable across
  that sub-agent's calls, so a hash of it names the sub-agent; any other call is the main agent.
  A compaction call asks the model to summarize the conversation so far.
- mini-swe-agent, the built-in harness and any other: one main agent.

Example:
    detect(system="You are Claude Code, Anthropic's official CLI for Claude.", ...) -> main/main
    detect(system="You are an agent for Claude Code ...", first_user="Find the bug") -> sub/sub-3f2a...
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gyre.errors import InvalidArgument

AgentRoleName = Literal["main", "sub", "summary"]
ROLE_HEADER = "x-gyre-agent-role"
ID_HEADER = "x-gyre-agent-id"
_ID_RE = re.compile(r"^[A-Za-z0-9_.:/@-]{1,128}$")
_SUMMARY_MARKERS = (
    "summary of the conversation",
    "summarize the conversation",
    "create a detailed summary",
    "your task is to create a detailed summary",
)
# Claude Code marks a sub-agent's system prompt (`cc_is_subagent=true` in its billing line, and
# "You are an agent for Claude Code" / "a ... specialist for Claude Code"); only then is the
# main agent's self-introduction ("You are Claude Code", or with `-p` "You are a Claude agent,
# built on ...", which sub-agents' prompts repeat) taken to mean the main agent.
# Claude Code's compaction call: "Your task is to create a detailed summary of the conversation
# so far ..." (or "of the RECENT portion ...") under this system prompt.
_SUMMARY_SYSTEM = "tasked with summarizing conversations"
_CLAUDE_CODE_SUB = ("cc_is_subagent=true", "You are an agent for Claude Code", "specialist for Claude Code")
_CLAUDE_CODE = ("Claude Code", "cc_entrypoint=")


@dataclass(frozen=True, slots=True, kw_only=True)
class Agent:
    role: AgentRoleName
    agent_id: str


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def detect(*, system: str, first_user: str, last_user: str, headers: Mapping[str, str]) -> Agent:
    detected = _detect(system=system, first_user=first_user, last_user=last_user)
    role_header = headers.get(ROLE_HEADER, "").strip().lower()
    id_header = headers.get(ID_HEADER, "").strip()
    if role_header and role_header not in ("main", "sub", "summary"):
        raise InvalidArgument("X-Gyre-Agent-Role", f"must be 'main', 'sub' or 'summary', got {role_header!r}")
    if id_header and not _ID_RE.match(id_header):
        raise InvalidArgument("X-Gyre-Agent-Id", "must be 1..128 of [A-Za-z0-9_.:/@-]")
    role: AgentRoleName = role_header or detected.role  # type: ignore[assignment]
    agent_id = id_header or (role if role_header and role_header != detected.role else detected.agent_id)
    return Agent(role=role, agent_id=agent_id)


def _detect(*, system: str, first_user: str, last_user: str) -> Agent:
    lowered = last_user.lower()
    if any(marker in lowered for marker in _SUMMARY_MARKERS) or _SUMMARY_SYSTEM in system:
        return Agent(role="summary", agent_id="summary")
    if any(m in system for m in _CLAUDE_CODE) and any(m in system for m in _CLAUDE_CODE_SUB):
        return Agent(role="sub", agent_id=f"sub-{_digest(first_user)}")
    return Agent(role="main", agent_id="main")
