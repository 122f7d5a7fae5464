"""Split a model's output text into visible text and tool calls, per the chat template (pure).

The chat template decides how a model writes a tool call. The one format supported is the
Hermes/Qwen one: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` after any text.
`ToolCallFormat.from_template` picks it when the template mentions `<tool_call>`; a template
without tools yields no calls and the whole output is text.

Example:
    parse_output('Let me look.<tool_call>{"name": "ls", "arguments": {"path": "."}}</tool_call>',
                 fmt=HERMES, call_ids=["call_1"])
    -> ParsedOutput(text="Let me look.", tool_calls=(ToolCall("call_1", "ls", {"path": "."}),))
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from services.proxy.chat import ToolCall


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFormat:
    open_tag: str
    close_tag: str

    @staticmethod
    def from_template(template: str) -> ToolCallFormat | None:
        return HERMES if HERMES.open_tag in template else None


HERMES = ToolCallFormat(open_tag="<tool_call>", close_tag="</tool_call>")


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedOutput:
    """`text` is what the harness sees as content; `malformed` counts calls that were not JSON."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    malformed: int = 0


def visible_prefix(text: str, fmt: ToolCallFormat | None) -> str:
    """The part of a partial output that is text for sure (streamed before the output ends).

    Holds back from the first tool-call tag, and a trailing partial tag that may become one.
    """
    if fmt is None:
        return text
    cut = text.find(fmt.open_tag)
    if cut >= 0:
        return text[:cut]
    for k in range(min(len(fmt.open_tag) - 1, len(text)), 0, -1):
        if fmt.open_tag.startswith(text[-k:]):
            return text[:-k]
    return text


def parse_output(text: str, *, fmt: ToolCallFormat | None, call_ids: Sequence[str]) -> ParsedOutput:
    """Text before the first tool call, then every well-formed call; ids come from `call_ids`."""
    if fmt is None or fmt.open_tag not in text:
        return ParsedOutput(text=text, tool_calls=())
    head, _, rest = text.partition(fmt.open_tag)
    calls: list[ToolCall] = []
    malformed = 0
    for piece in rest.split(fmt.open_tag):
        body = piece.split(fmt.close_tag, 1)[0].strip()
        call = _decode_call(body, call_id=call_ids[len(calls)] if len(calls) < len(call_ids) else "")
        if call is None:
            malformed += 1
        else:
            calls.append(call)
    return ParsedOutput(text=head.rstrip() if calls else text, tool_calls=tuple(calls), malformed=malformed)


def _decode_call(body: str, *, call_id: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(call_id=call_id, name=obj["name"], arguments=arguments)
