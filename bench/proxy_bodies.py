"""Harness request bodies for fuzzing the proxy: valid, near-valid and hostile (hypothesis strategies).

`bodies(dialect, max_chars=...)` draws the raw bytes of one OpenAI Chat Completions or Anthropic
Messages request, as a harness (or a policy probing the proxy) could send it:
- valid: a conversation with tool calls and results, tools with schemas, system text, sampling
  parameters in range;
- near-valid: one field made wrong (a wrong type, an out-of-range number such as a `seed` past
  uint64, an unknown role, a tool result answering no call, a block of the wrong kind);
- hostile: lone UTF-16 surrogates in any string or key, tools whose name, description or schema
  holds about as many characters as the whole request may (`max_chars`, just under or just over),
  NaN and infinities, huge integers, deep schemas, bytes that are not UTF-8.

The proxy must answer every one with a 2xx or a 4xx in the dialect's own error shape: used by
`tests/test_proxy_hostile_input.py` and `python -m bench.proxy_fuzz`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from hypothesis import strategies as st

Dialect = Literal["openai", "anthropic"]
SURROGATES = ["\ud800", "\udfff", "a\udc00b", "\ud83d"]
HUGE_NUMBERS: list[Any] = [
    2**64,
    2**63,
    -(2**63) - 1,
    10**30,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    -1,
    0,
]

TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
NAMES = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)


def _schema(draw: st.DrawFn) -> dict[str, Any]:
    props = draw(st.dictionaries(NAMES, st.sampled_from(["string", "integer", "boolean"]), max_size=3))
    return {"type": "object", "properties": {k: {"type": v} for k, v in props.items()}}


@st.composite
def _valid_openai(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": draw(st.sampled_from(["system", "developer"])), "content": draw(TEXT)})
    messages.append({"role": "user", "content": draw(TEXT)})
    tools = [
        {
            "type": "function",
            "function": {"name": draw(NAMES), "description": draw(TEXT), "parameters": _schema(draw)},
        }
        for _ in range(draw(st.integers(0, 2)))
    ]
    if tools and draw(st.booleans()):
        call_id = f"call_{draw(NAMES)}"
        name = tools[0]["function"]["name"]
        args = json.dumps({"command": draw(TEXT)})
        messages.append(
            {
                "role": "assistant",
                "content": draw(st.none() | TEXT),
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": draw(TEXT)})
        messages.append({"role": "user", "content": [{"type": "text", "text": draw(TEXT)}]})
    body: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": draw(st.integers(1, 8))}
    if tools:
        body["tools"] = tools
    for key, value in (
        ("temperature", st.floats(0, 2)),
        ("top_p", st.floats(0, 1)),
        ("seed", st.integers(0, 2**63 - 1)),
        ("stream", st.booleans()),
    ):
        if draw(st.booleans()):
            body[key] = draw(value)
    return body


@st.composite
def _valid_anthropic(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(TEXT) or "hi"}]
    tools = [
        {"name": draw(NAMES), "description": draw(TEXT), "input_schema": _schema(draw)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    if tools and draw(st.booleans()):
        use_id = f"toolu_{draw(NAMES)}"
        messages.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": draw(TEXT)},
                    {"type": "tool_use", "id": use_id, "name": tools[0]["name"], "input": {"q": draw(TEXT)}},
                ],
            }
        )
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use_id, "content": draw(TEXT)},
                    {"type": "text", "text": draw(TEXT) or "go on"},
                ],
            }
        )
    body: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": draw(st.integers(1, 8))}
    if tools:
        body["tools"] = tools
    if draw(st.booleans()):
        body["system"] = draw(st.sampled_from([draw(TEXT), [{"type": "text", "text": draw(TEXT)}]]))
    for key, value in (
        ("temperature", st.floats(0, 1)),
        ("top_p", st.floats(0, 1)),
        ("stream", st.booleans()),
    ):
        if draw(st.booleans()):
            body[key] = draw(value)
    return body


def _strings(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every string value and every dict key in `value` (a key's path ends in its dict)."""
    if isinstance(value, str):
        return [path]
    out: list[tuple[Any, ...]] = []
    if isinstance(value, dict):
        for key, child in value.items():
            out.append((*path, ("key", key)))
            out.extend(_strings(child, (*path, key)))
    elif isinstance(value, list):
        for i, child in enumerate(value):
            out.extend(_strings(child, (*path, i)))
    return out


def _replace(body: Any, path: tuple[Any, ...], make: Any) -> None:
    """Replace the string (or the key) at `path` with `make(old)`."""
    *parent_path, last = path
    parent = body
    for step in parent_path:
        parent = parent[step]
    if isinstance(last, tuple):  # a key: rename it, keeping its value
        key = last[1]
        parent[make(key)] = parent.pop(key)
    else:
        parent[last] = make(parent[last])


@st.composite
def _near_valid(draw: st.DrawFn, body: dict[str, Any], dialect: Dialect) -> dict[str, Any]:
    numeric = ["max_tokens", "temperature", "top_p"] + (
        ["seed", "n", "max_completion_tokens"] if dialect == "openai" else []
    )
    kind = draw(st.sampled_from(["number", "type", "role", "orphan-result", "block", "tool"]))
    if kind == "number":
        body[draw(st.sampled_from(numeric))] = draw(st.sampled_from(HUGE_NUMBERS) | st.integers())
    elif kind == "type":
        key = draw(st.sampled_from(["model", "messages", "tools", "stream", "system", *numeric]))
        body[key] = draw(st.sampled_from([None, 1, "x", [], {}, [1], True, [{"role": 1}]]))
    elif kind == "role":
        body["messages"][0]["role"] = draw(st.sampled_from(["robot", "", "tool", "function", "ASSISTANT"]))
    elif kind == "orphan-result":
        if dialect == "openai":
            body["messages"].append({"role": "tool", "tool_call_id": "nobody", "content": "x"})
        else:
            block = {"type": "tool_result", "tool_use_id": "nobody", "content": "x"}
            body["messages"].append({"role": "user", "content": [block]})
    elif kind == "block":
        block = draw(
            st.sampled_from([{"type": "image", "source": {}}, {"type": "text"}, {"text": "x"}, "text"])
        )
        body["messages"][0]["content"] = [block]
    else:
        bad: Any = draw(st.sampled_from([{"type": "function"}, {"function": {"name": 3}}, {"name": None}, 7]))
        body["tools"] = [bad]
    return body


@st.composite
def _hostile(
    draw: st.DrawFn, body: dict[str, Any], dialect: Dialect, max_chars: int
) -> dict[str, Any] | bytes:
    kind = draw(
        st.sampled_from(["surrogate", "huge-tool", "huge-system", "huge-args", "numbers", "deep", "not-utf8"])
    )
    if kind == "surrogate":
        path = draw(st.sampled_from(_strings(body)))
        bad = draw(st.sampled_from(SURROGATES))
        _replace(body, path, lambda old: old + bad)
    elif kind in ("huge-tool", "huge-system", "huge-args"):
        # About the whole request's allowance in one part: just under (rendered, maybe refused by
        # the tokenised length) or just over (refused before rendering).
        size = max(1, int(max_chars * draw(st.sampled_from([0.5, 0.98, 1.02, 2.0]))))
        filler = draw(st.sampled_from(["x", "ab ", "🙂", '{"', "\n"]))
        text = (filler * (size // len(filler) + 1))[:size]
        if kind == "huge-system":
            if dialect == "anthropic":
                body["system"] = text
            else:
                body["messages"].insert(0, {"role": "system", "content": text})
        elif kind == "huge-args":
            _huge_tool_call(body, dialect, text)
        else:
            where = draw(st.sampled_from(["name", "description", "schema"]))
            tool: dict[str, Any] = {"name": "t", "description": "", "schema": {"type": "object"}}
            tool[where] = {"type": "object", "description": text} if where == "schema" else text
            if dialect == "openai":
                fn = {"name": tool["name"], "description": tool["description"], "parameters": tool["schema"]}
                body["tools"] = [{"type": "function", "function": fn}]
            else:
                body["tools"] = [
                    {"name": tool["name"], "description": tool["description"], "input_schema": tool["schema"]}
                ]
    elif kind == "numbers":
        body["seed" if dialect == "openai" else "max_tokens"] = draw(st.sampled_from(HUGE_NUMBERS))
        body["temperature"] = draw(st.sampled_from(HUGE_NUMBERS))
    elif kind == "deep":
        schema: dict[str, Any] = {"type": "object"}
        for _ in range(draw(st.integers(10, 80))):
            schema = {"type": "object", "properties": {"x": schema}}
        fn = {"name": "deep", "parameters": schema}
        body["tools"] = (
            [{"type": "function", "function": fn}]
            if dialect == "openai"
            else [{"name": "deep", "input_schema": schema}]
        )
    else:
        return json.dumps(body).encode()[:-2] + b'\xff\xfe"}'
    return body


def _huge_tool_call(body: dict[str, Any], dialect: Dialect, text: str) -> None:
    if dialect == "openai":
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "t", "arguments": json.dumps({"a": text})},
        }
        body["messages"] += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]
    else:
        body["messages"] += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "u1", "name": "t", "input": {"a": text}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "ok"}]},
        ]


@st.composite
def bodies(draw: st.DrawFn, dialect: Dialect, *, max_chars: int) -> tuple[str, bytes]:
    """(kind, raw body): kind is "valid", "near-valid" or "hostile"."""
    body = draw(_valid_openai() if dialect == "openai" else _valid_anthropic())
    kind = draw(st.sampled_from(["valid", "near-valid", "hostile", "hostile"]))
    out: dict[str, Any] | bytes = body
    if kind == "near-valid":
        out = draw(_near_valid(body, dialect))
    elif kind == "hostile":
        out = draw(_hostile(body, dialect, max_chars))
    return kind, out if isinstance(out, bytes) else json.dumps(out).encode()


def largest_accepted(dialect: Dialect, *, max_chars: int) -> bytes:
    """A body whose tool description takes nearly all of the allowance the early bound lets
    through: the most rendering and tokenising one request can make the proxy do."""
    text = ("lorem ipsum dolor sit amet " * (max_chars // 27 + 1))[: max_chars - 200]
    messages = [{"role": "user", "content": "go"}]
    if dialect == "openai":
        tools: list[dict[str, Any]] = [{"type": "function", "function": {"name": "t", "description": text}}]
    else:
        tools = [{"name": "t", "description": text, "input_schema": {"type": "object"}}]
    return json.dumps({"model": "tiny", "max_tokens": 1, "messages": messages, "tools": tools}).encode()
