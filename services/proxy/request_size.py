"""The early size bound: a request whose parts cannot fit the context window is refused before
anything is rendered or tokenised (pure).

Every part the chat template is given counts: each turn's text, its tool calls (id, name,
arguments), a tool turn's call id, and each offered tool's name, description and JSON schema.
A text of n characters needs at least n / max_token_chars tokens (no vocabulary entry is longer),
so a request whose parts add up to more than `context_window_tokens * max_token_chars`
characters cannot fit, whatever the template adds around them. The refusal names the largest
part, which is where a harness (or a policy probing the proxy) put the bulk.

Example (window 100 tokens, at most 4 characters a token: 400 characters):
    messages[0] "hi" (2), tools[0] with a 1000-character description (1000 + name + schema)
    -> InvalidArgument("tools[0].description", "... over the context window of 100 tokens ...")
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gyre.errors import InvalidArgument
from services.proxy.chat import ChatMessage, ChatRequest, ToolSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class SizeBound:
    """The most characters a request's parts may hold: the context window times the longest
    token's characters (0 for either: no early bound)."""

    context_window_tokens: int
    max_token_chars: int

    @property
    def max_chars(self) -> int:
        return self.context_window_tokens * self.max_token_chars


ESCAPED_BYTES_PER_CHAR = 12
"""The most bytes JSON can spend on one character: a code point outside the BMP escaped as a
surrogate pair (`\\ud83d\\ude00`)."""
BODY_SLACK_BYTES = 1024 * 1024
"""Room for what a body carries besides rendered parts: keys, roles, ignored fields, server tools."""


def body_limit(bound: SizeBound, *, ceiling: int) -> int:
    """The most bytes a body can need to carry parts that fit the bound (at most `ceiling`):
    a bigger body is refused before it is read whole or decoded.

    Example: a 4096-token window, 16 characters a token, ceiling 32 MiB
    -> 4096 * 16 * 12 + 1 MiB = 1,835,008 bytes
    """
    if not bound.max_chars:
        return ceiling
    return min(ceiling, bound.max_chars * ESCAPED_BYTES_PER_CHAR + BODY_SLACK_BYTES)


def parts(request: ChatRequest) -> Iterator[tuple[str, int]]:
    """Each rendered part of the request with its characters, named by its place in the body.

    Example: a user turn "hi" from messages[0], a tool "bash" (no description, schema {})
    from tools[0] -> ("messages[0].content", 2), ("tools[0].name", 4),
    ("tools[0].description", 0), ("tools[0].parameters", 2)
    """
    for i, message in enumerate(request.messages):
        yield from _message_parts(message, message.source or f"messages[{i}]")
    for i, tool in enumerate(request.tools):
        yield from _tool_parts(tool, tool.source or f"tools[{i}]")


def _message_parts(message: ChatMessage, path: str) -> Iterator[tuple[str, int]]:
    yield f"{path}.content" if path != "system" else path, len(message.content)
    if message.tool_call_id:
        yield f"{path}.tool_call_id", len(message.tool_call_id)
    for j, call in enumerate(message.tool_calls):
        yield f"{path}.tool_calls[{j}]", len(call.call_id) + len(call.name) + _json_chars(call.arguments)


def _tool_parts(tool: ToolSpec, path: str) -> Iterator[tuple[str, int]]:
    yield f"{path}.name", len(tool.name)
    yield f"{path}.description", len(tool.description)
    yield f"{path}.{tool.schema_field}", _json_chars(tool.parameters)


def _json_chars(value: dict[str, Any]) -> int:
    # Compact and unescaped: the fewest characters any template's `tojson` renders it in.
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


def check_size(request: ChatRequest, bound: SizeBound) -> int:
    """The request's characters; InvalidArgument naming its largest part when they cannot fit."""
    total, largest, largest_chars = 0, "messages", -1
    for path, chars in parts(request):
        total += chars
        if chars > largest_chars:
            largest, largest_chars = path, chars
    if bound.max_chars and total > bound.max_chars:
        raise InvalidArgument(
            largest,
            f"the request is over the context window of {bound.context_window_tokens} tokens: its "
            f"messages, system text and tools hold {total} characters, more than the "
            f"{bound.max_chars} that many tokens can cover (a token covers at most "
            f"{bound.max_token_chars}); this part alone holds {largest_chars}",
        )
    return total
