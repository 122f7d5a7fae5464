"""Context bookkeeping of the agent: size estimate, when to compact, the compacted context (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]

SUMMARY_REQUEST = (
    "Your context is full. Summarize the work so far for yourself: what the task is, what is done "
    "(files written, tests passing), what is left and what you learned. Be concise; no tool calls."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    context_tokens: int = 24000
    """Compact when the estimated prompt passes this many tokens."""
    chars_per_token: float = 4.0
    """Rough size of a token; the proxy knows the exact count, the agent only needs a trigger."""


def estimate_tokens(messages: list[Message], *, budget: Budget) -> int:
    """Approximate tokens of a prompt from its JSON size.

    Example:
        estimate_tokens([{"role": "user", "content": "x" * 400}], budget=Budget()) -> 109
    """
    return int(len(json.dumps(messages)) / budget.chars_per_token)


def should_compact(messages: list[Message], *, budget: Budget) -> bool:
    return len(messages) > 2 and estimate_tokens(messages, budget=budget) > budget.context_tokens


def summary_prompt(messages: list[Message]) -> list[Message]:
    """The compaction call: the whole context plus the request to summarize it."""
    return [*messages, {"role": "user", "content": SUMMARY_REQUEST}]


def compacted(messages: list[Message], *, summary: str) -> list[Message]:
    """A fresh context: the system prompt, the original task and the summary.

    Example:
        compacted([sys, task, a1, t1, a2], summary="did X") -> [sys, task, user("Summary ...did X")]
    """
    head = messages[:2]
    note = {
        "role": "user",
        "content": f"Summary of your earlier work (your context was compacted):\n{summary}",
    }
    return [*head, note]


def truncate(text: str, *, limit: int) -> str:
    """Keep the head and the tail of long tool output, which hold the command and the verdict."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters cut] ...\n{text[-half:]}"
