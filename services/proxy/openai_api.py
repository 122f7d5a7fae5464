"""OpenAI Chat Completions: request parsing, responses, stream chunks, errors (pure).

Accepts what the official SDK and OpenAI-compatible harnesses (mini-swe-agent through litellm)
send; fields the proxy does not act on (`user`, `store`, `stream_options`, `parallel_tool_calls`,
`metadata`, ...) are accepted and ignored, and parameters whose meaning it cannot honour
(`n` > 1, `logit_bias`, `stop`) are refused by name rather than silently dropped.
"""

from __future__ import annotations

from typing import Any

from gyre.errors import InvalidArgument
from services.proxy import fields as f
from services.proxy.chat import ChatMessage, ChatRequest, Role, Sampling, ToolCall, ToolSpec
from services.proxy.outcome import CallOutcome, Usage

UNSUPPORTED = {
    "logit_bias": "is not supported by this proxy",
    "stop": "is not supported by this proxy (the model's end-of-turn token ends the output)",
    "audio": "is not supported by this proxy",
    "prediction": "is not supported by this proxy",
}
_ROLES: dict[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}


def parse_request(body: Any) -> ChatRequest:
    body = f.obj(body, "body")
    for key, problem in UNSUPPORTED.items():
        if body.get(key) is not None:
            raise InvalidArgument(key, problem)
    n = f.integer(body, "n", "n", lo=1)
    if n is not None and n != 1:
        raise InvalidArgument("n", f"only 1 choice per request is supported, got {n}")
    model = f.string(body, "model", "model")
    raw_messages = f.arr(body.get("messages"), "messages", min_len=1)
    messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw_messages))
    _check_tool_results(messages)
    tools = tuple(_tool(t, f"tools[{i}]") for i, t in enumerate(f.arr(body.get("tools", []), "tools")))
    max_tokens = f.integer(body, "max_completion_tokens", "max_completion_tokens", lo=1)
    if max_tokens is None:
        max_tokens = f.integer(body, "max_tokens", "max_tokens", lo=1)
    sampling = Sampling(
        temperature=f.number(body, "temperature", "temperature", lo=0, hi=2, default=1.0),
        top_p=f.number(body, "top_p", "top_p", lo=0, hi=1, default=1.0) or 1.0,
        max_tokens=max_tokens,
        seed=f.integer(body, "seed", "seed", lo=0),
    )
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        sampling=sampling,
        stream=f.boolean(body, "stream", "stream"),
    )


def _text(content: Any, path: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = f.arr(content, path)
    texts = []
    for i, part in enumerate(parts):
        part = f.obj(part, f"{path}[{i}]")
        kind = f.string(part, "type", f"{path}[{i}].type")
        if kind not in ("text", "input_text", "output_text"):
            raise InvalidArgument(f"{path}[{i}].type", f"only text content is supported, got {kind!r}")
        texts.append(f.string(part, "text", f"{path}[{i}].text"))
    return "".join(texts)


def _message(raw: Any, path: str) -> ChatMessage:
    m = f.obj(raw, path)
    role_name = f.string(m, "role", f"{path}.role")
    role = _ROLES.get(role_name)
    if role is None:
        raise InvalidArgument(f"{path}.role", f"must be one of {sorted(_ROLES)}, got {role_name!r}")
    content = _text(m.get("content"), f"{path}.content")
    if role == "tool":
        call_id = f.string(m, "tool_call_id", f"{path}.tool_call_id")
        return ChatMessage(role="tool", content=content, tool_call_id=call_id, source=path)
    calls: list[ToolCall] = []
    if role == "assistant":
        for j, raw_call in enumerate(f.arr(m.get("tool_calls") or [], f"{path}.tool_calls")):
            cpath = f"{path}.tool_calls[{j}]"
            call = f.obj(raw_call, cpath)
            fn = f.obj(call.get("function"), f"{cpath}.function")
            arguments = fn.get("arguments", "{}")
            calls.append(
                ToolCall(
                    call_id=f.string(call, "id", f"{cpath}.id"),
                    name=f.string(fn, "name", f"{cpath}.function.name"),
                    arguments=(
                        f.obj(arguments, f"{cpath}.function.arguments")
                        if isinstance(arguments, dict)
                        else f.json_object_text(
                            f.string(fn, "arguments", f"{cpath}.function.arguments"),
                            f"{cpath}.function.arguments",
                        )
                    ),
                )
            )
    return ChatMessage(role=role, content=content, tool_calls=tuple(calls), source=path)


def _check_tool_results(messages: tuple[ChatMessage, ...]) -> None:
    known: set[str] = set()
    for i, m in enumerate(messages):
        known.update(c.call_id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in known:
            raise InvalidArgument(
                f"messages[{i}].tool_call_id",
                f"{m.tool_call_id!r} answers no tool call of an earlier assistant message",
            )


def _tool(raw: Any, path: str) -> ToolSpec:
    t = f.obj(raw, path)
    kind = t.get("type", "function")
    if kind != "function":
        raise InvalidArgument(f"{path}.type", f"only 'function' tools are supported, got {kind!r}")
    fn = f.obj(t.get("function"), f"{path}.function")
    return ToolSpec(
        name=f.string(fn, "name", f"{path}.function.name"),
        description=f.string(fn, "description", f"{path}.function.description", default=""),
        parameters=f.obj(
            fn.get("parameters", {"type": "object", "properties": {}}), f"{path}.function.parameters"
        ),
        source=f"{path}.function",
    )


FINISH = {"stop": "stop", "tool_calls": "tool_calls", "length": "length", "cancelled": "stop"}


def _tool_call_dict(call: ToolCall, index: int) -> dict[str, Any]:
    return {
        "index": index,
        "id": call.call_id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.prompt_tokens + usage.output_tokens,
    }


def completion(*, completion_id: str, model: str, created_s: int, outcome: CallOutcome) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": outcome.text or None}
    if outcome.tool_calls:
        message["tool_calls"] = [
            {k: v for k, v in _tool_call_dict(c, i).items() if k != "index"}
            for i, c in enumerate(outcome.tool_calls)
        ]
    elif message["content"] is None:
        message["content"] = ""
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created_s,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": FINISH[outcome.finish]}],
        "usage": _usage(outcome.usage),
    }


def chunk(
    *, completion_id: str, model: str, created_s: int, delta: dict[str, Any], finish: str | None = None
) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created_s,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": FINISH[finish] if finish else None}],
    }


def final_chunks(
    *, completion_id: str, model: str, created_s: int, outcome: CallOutcome, include_usage: bool
) -> list[dict[str, Any]]:
    """Tool calls (each whole, in one delta), the finish chunk, and the usage chunk if asked."""
    out = [
        chunk(
            completion_id=completion_id,
            model=model,
            created_s=created_s,
            delta={"tool_calls": [_tool_call_dict(c, i)]},
        )
        for i, c in enumerate(outcome.tool_calls)
    ]
    out.append(
        chunk(completion_id=completion_id, model=model, created_s=created_s, delta={}, finish=outcome.finish)
    )
    if include_usage:
        last = chunk(completion_id=completion_id, model=model, created_s=created_s, delta={})
        last["choices"] = []
        last["usage"] = _usage(outcome.usage)
        out.append(last)
    return out


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


def error(status: int, message: str, *, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": ERROR_TYPES.get(status, "invalid_request_error"),
            "param": param,
            "code": None,
        }
    }


def models(names: list[str], *, created_s: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": created_s, "owned_by": "gyre"} for n in names],
    }
