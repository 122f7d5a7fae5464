"""The proxy's API-neutral view of a chat call: messages, tools, sampling (pure).

Both HTTP dialects (OpenAI Chat Completions, Anthropic Messages) parse into these types, and the
renderer turns them into token ids with the model's chat template. Messages use the shape chat
templates expect (`role`, `content`, `tool_calls`, `tool_call_id`), so `as_template_dict` is a
plain field copy.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A call of a tool by the model; `arguments` is the JSON object the model wrote."""

    call_id: str
    name: str
    arguments: dict[str, Any]

    def as_template_dict(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }

    @property
    def arguments_json(self) -> str:
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatMessage:
    """One turn. `tool_calls` only on assistant turns, `tool_call_id` only on tool turns."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    name: str = ""
    source: str = ""
    """Where in the request body the turn came from (`messages[3]`, `system`), for refusals."""

    def as_template_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.as_template_dict() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        if self.name:
            out["name"] = self.name
        return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool the harness offers the model (JSON-schema parameters)."""

    name: str
    description: str
    parameters: dict[str, Any]
    source: str = ""
    """Where in the request body the tool came from (`tools[2].function`), for refusals."""
    schema_field: str = "parameters"
    """The dialect's name of the schema field (Anthropic: `input_schema`), for refusals."""

    def as_template_dict(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How to sample; `max_tokens` None means up to the context window."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ChatRequest:
    """A parsed call of either dialect."""

    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False

    @property
    def system_text(self) -> str:
        return "\n".join(m.content for m in self.messages if m.role == "system")

    @property
    def first_user_text(self) -> str:
        return next((m.content for m in self.messages if m.role == "user"), "")

    @property
    def last_user_text(self) -> str:
        return next((m.content for m in reversed(self.messages) if m.role == "user"), "")
