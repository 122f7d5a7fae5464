"""Decode a harness's request body into JSON that every later step can take (pure).

What `json.loads` accepts is wider than what the proxy can use: it returns strings holding lone
UTF-16 surrogates (`"\\ud800"`), which no UTF-8 encoder takes (the tokenizer, the call key's
digest, Postgres), and containers nested as deep as the parser's stack allows. Both are refused
here, once, naming where in the body they are, so no later step meets them and fails as the
proxy's own error (HTTP 5xx, counted against the proxy).

Example:
    decode_body(b'{"messages": [{"content": "\\\\ud800"}]}')
    -> InvalidArgument("messages[0].content: holds a lone UTF-16 surrogate (\\\\ud800) ...")
"""

from __future__ import annotations

import json
from typing import Any

from gyre.errors import InvalidArgument

MAX_JSON_DEPTH = 64
"""Deeper request bodies are refused: nothing either API sends nests this far, and templates and
serialisers downstream would recurse through it."""


def decode_body(raw: bytes) -> Any:
    """The parsed body, or InvalidArgument naming what is wrong and where."""
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise InvalidArgument("body", f"is nested deeper than {MAX_JSON_DEPTH} levels") from exc
    except ValueError as exc:  # UnicodeDecodeError too: bytes that are not UTF-8
        raise InvalidArgument("body", f"is not valid JSON: {exc}") from exc
    if json_depth(body, limit=MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise InvalidArgument("body", f"is nested deeper than {MAX_JSON_DEPTH} levels")
    bad = unencodable_path(body)
    if bad is not None:
        path, char = bad
        raise InvalidArgument(
            path or "body",
            f"holds a lone UTF-16 surrogate (\\u{ord(char):04x}), which is not text: "
            "surrogates must come in high-low pairs",
        )
    return body


def json_depth(value: Any, *, limit: int) -> int:
    """Nesting depth of parsed JSON, without recursion; stops counting past `limit`.

    Example: json_depth({"a": [1, {"b": 2}]}, limit=64) -> 3
    """
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (dict, list)):
            continue
        deepest = max(deepest, depth)
        if depth > limit:
            return depth
        stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def unencodable_path(value: Any) -> tuple[str, str] | None:
    """The path of the first string (value or key) UTF-8 cannot encode, and its bad character.

    Example: unencodable_path({"tools": [{"name": "a\\udc00"}]}) -> ("tools[0].name", "\\udc00")
    """
    stack: list[tuple[Any, str]] = [(value, "")]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            char = _lone_surrogate(item)
            if char:
                return path, char
        elif isinstance(item, dict):
            for key, child in item.items():
                child_path = f"{path}.{key}" if path else str(key)
                char = _lone_surrogate(key)
                if char:
                    return path or "body", char
                stack.append((child, child_path))
        elif isinstance(item, list):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def _lone_surrogate(text: str) -> str:
    if text.isascii():
        return ""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return text[exc.start]
    return ""
