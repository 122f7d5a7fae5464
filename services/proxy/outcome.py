"""What a finished call hands back to either HTTP dialect (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from services.proxy.chat import ToolCall

Finish = Literal["stop", "tool_calls", "length", "cancelled"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Usage:
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CallOutcome:
    """The model's answer as the harness sees it: text, tool calls, why it ended, token counts."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    finish: Finish
    usage: Usage
