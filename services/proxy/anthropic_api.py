"""Anthropic Messages: request parsing, responses, SSE events, errors (pure).

Accepts what Claude Code sends: `system` as a string or text blocks, `role: "system"` turns
inside `messages`, `cache_control` on any block, `thinking`, `metadata`,
`context_management`, server tools and other fields the proxy does not act on (ignored).
`tool_result` blocks become `tool` turns for the chat template, in the order they appear.
"""

from __future__ import annotations

import json
from typing import Any

from gyre.errors import InvalidArgument
from services.proxy import fields as f
from services.proxy.chat import ChatMessage, ChatRequest, Sampling, ToolCall, ToolSpec
from services.proxy.outcome import CallOutcome, Usage

IGNORED_BLOCKS = ("thinking", "redacted_thinking")


def parse_request(body: Any) -> ChatRequest:
    body = f.obj(body, "body")
    model = f.string(body, "model", "model")
    max_tokens = f.integer(body, "max_tokens", "max_tokens", lo=1)
    if max_tokens is None:
        raise InvalidArgument("max_tokens", "is required")
    stops = body.get("stop_sequences")
    if stops:
        raise InvalidArgument("stop_sequences", "is not supported by this proxy")
    messages: list[ChatMessage] = []
    system = body.get("system")
    if system is not None:
        text = _text_blocks(system, "system")
        if text:
            messages.append(ChatMessage(role="system", content=text, source="system"))
    raw_messages = f.arr(body.get("messages"), "messages", min_len=1)
    for i, raw in enumerate(raw_messages):
        messages.extend(_turn(raw, f"messages[{i}]"))
    _check_tool_results(messages)
    tools = tuple(
        t for i, raw in enumerate(f.arr(body.get("tools", []), "tools")) if (t := _tool(raw, f"tools[{i}]"))
    )
    sampling = Sampling(
        temperature=f.number(body, "temperature", "temperature", lo=0, hi=1, default=1.0),
        top_p=f.number(body, "top_p", "top_p", lo=0, hi=1, default=1.0) or 1.0,
        max_tokens=max_tokens,
    )
    return ChatRequest(
        model=model,
        messages=tuple(messages),
        tools=tools,
        sampling=sampling,
        stream=f.boolean(body, "stream", "stream"),
    )


def _text_blocks(value: Any, path: str) -> str:
    if isinstance(value, str):
        return value
    texts = []
    for i, block in enumerate(f.arr(value, path)):
        block = f.obj(block, f"{path}[{i}]")
        kind = f.string(block, "type", f"{path}[{i}].type")
        if kind in IGNORED_BLOCKS:
            continue
        if kind != "text":
            raise InvalidArgument(f"{path}[{i}].type", f"expected a 'text' block here, got {kind!r}")
        texts.append(f.string(block, "text", f"{path}[{i}].text"))
    return "\n\n".join(texts) if path == "system" else "".join(texts)


def _turn(raw: Any, path: str) -> list[ChatMessage]:
    m = f.obj(raw, path)
    role = f.string(m, "role", f"{path}.role")
    if role not in ("user", "assistant", "system"):
        raise InvalidArgument(f"{path}.role", f"must be 'user', 'assistant' or 'system', got {role!r}")
    content = m.get("content")
    if content is None:
        raise InvalidArgument(f"{path}.content", "is required")
    if isinstance(content, str):
        return [ChatMessage(role=role, content=content, source=path)]  # type: ignore[arg-type]
    if role == "system":
        return [ChatMessage(role="system", content=_text_blocks(content, f"{path}.content"), source=path)]
    out: list[ChatMessage] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for j, raw_block in enumerate(f.arr(content, f"{path}.content")):
        bpath = f"{path}.content[{j}]"
        block = f.obj(raw_block, bpath)
        kind = f.string(block, "type", f"{bpath}.type")
        if kind == "text":
            texts.append(f.string(block, "text", f"{bpath}.text"))
        elif kind in IGNORED_BLOCKS:
            continue
        elif kind == "tool_use" and role == "assistant":
            calls.append(
                ToolCall(
                    call_id=f.string(block, "id", f"{bpath}.id"),
                    name=f.string(block, "name", f"{bpath}.name"),
                    arguments=f.obj(block.get("input", {}), f"{bpath}.input"),
                )
            )
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = _text_blocks(result, f"{bpath}.content") if result else ""
            if block.get("is_error") is True:
                text = f"Error: {text}"
            out.append(
                ChatMessage(
                    role="tool",
                    content=text,
                    tool_call_id=f.string(block, "tool_use_id", f"{bpath}.tool_use_id"),
                    source=bpath,
                )
            )
        else:
            raise InvalidArgument(f"{bpath}.type", f"a {role} turn cannot hold a {kind!r} block here")
    if role == "assistant":
        out.append(
            ChatMessage(role="assistant", content="".join(texts), tool_calls=tuple(calls), source=path)
        )
    elif texts or not out:
        out.append(ChatMessage(role="user", content="".join(texts), source=path))
    return out


def _check_tool_results(messages: list[ChatMessage]) -> None:
    known: set[str] = set()
    for m in messages:
        known.update(c.call_id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in known:
            raise InvalidArgument(
                "messages",
                f"tool_result for tool_use_id {m.tool_call_id!r} answers no tool_use of an earlier turn",
            )


def _tool(raw: Any, path: str) -> ToolSpec | None:
    t = f.obj(raw, path)
    kind = t.get("type", "custom")
    if kind not in ("custom", None):
        return None  # a server tool (web search, ...): nothing this proxy's model can call
    return ToolSpec(
        name=f.string(t, "name", f"{path}.name"),
        description=f.string(t, "description", f"{path}.description", default=""),
        parameters=f.obj(t.get("input_schema", {"type": "object"}), f"{path}.input_schema"),
        source=path,
        schema_field="input_schema",
    )


STOP_REASON = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "cancelled": "end_turn"}


def _usage(usage: Usage, *, output: bool = True) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "output_tokens": usage.output_tokens if output else 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_prompt_tokens,
    }


def tool_use_block(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.call_id, "name": call.name, "input": call.arguments}


def message(*, message_id: str, model: str, outcome: CallOutcome) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if outcome.text or not outcome.tool_calls:
        content.append({"type": "text", "text": outcome.text})
    content.extend(tool_use_block(c) for c in outcome.tool_calls)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": STOP_REASON[outcome.finish],
        "stop_sequence": None,
        "usage": _usage(outcome.usage),
    }


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


PING = sse("ping", {"type": "ping"})
"""Sent while the engine is silent (a long prompt's prefill), as Anthropic's API does: a client
that gives up on an idle stream (Claude Code after 5 minutes) keeps waiting."""


def message_start(*, message_id: str, model: str, prompt_tokens: int) -> bytes:
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(Usage(prompt_tokens=prompt_tokens, output_tokens=0), output=False),
    }
    return sse("message_start", {"type": "message_start", "message": start})


def text_block_start(index: int) -> bytes:
    return sse(
        "content_block_start",
        {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
    )


def text_delta(index: int, text: str) -> bytes:
    return sse(
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": text}},
    )


def block_stop(index: int) -> bytes:
    return sse("content_block_stop", {"type": "content_block_stop", "index": index})


def tool_use_events(index: int, call: ToolCall) -> bytes:
    start: dict[str, Any] = {**tool_use_block(call), "input": {}}
    return (
        sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
        + sse(
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": index,
                "delta": {"type": "input_json_delta", "partial_json": call.arguments_json},
            },
        )
        + block_stop(index)
    )


def message_end(outcome: CallOutcome) -> bytes:
    delta = {
        "type": "message_delta",
        "delta": {"stop_reason": STOP_REASON[outcome.finish], "stop_sequence": None},
        "usage": {"output_tokens": outcome.usage.output_tokens},
    }
    return sse("message_delta", delta) + sse("message_stop", {"type": "message_stop"})


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    500: "api_error",
    503: "overloaded_error",
}


def error(status: int, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}
