"""Typed reads of decoded JSON request bodies, naming the offending field on error (pure).

Example:
    number({"temperature": "hot"}, "temperature", lo=0, hi=2, default=1.0)
    -> InvalidArgument("temperature: must be a number between 0 and 2, got 'hot'")
"""

from __future__ import annotations

import json
from typing import Any

from gyre.errors import InvalidArgument


def _show(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def obj(value: Any, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidArgument(path, f"must be an object, got {_show(value)}")
    return value


def arr(value: Any, path: str, *, min_len: int = 0) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidArgument(path, f"must be an array, got {_show(value)}")
    if len(value) < min_len:
        raise InvalidArgument(path, f"must have at least {min_len} item(s)")
    return value


def string(body: dict[str, Any], key: str, path: str, *, default: str | None = None) -> str:
    value = body.get(key, default)
    if value is None:
        raise InvalidArgument(path, "is required")
    if not isinstance(value, str):
        raise InvalidArgument(path, f"must be a string, got {_show(value)}")
    return value


def number(body: dict[str, Any], key: str, path: str, *, lo: float, hi: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise InvalidArgument(path, f"must be a number between {lo:g} and {hi:g}, got {_show(value)}")
    return float(value)


INT64_MAX = 2**63 - 1
"""The default upper bound of an integer field: what every downstream field (protobuf int64 and
uint64, Postgres bigint) holds, so no harness number overflows one as the proxy's own error."""


def integer(body: dict[str, Any], key: str, path: str, *, lo: int, hi: int = INT64_MAX) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise InvalidArgument(path, f"must be an integer between {lo} and {hi}, got {_show(value)}")
    return value


def boolean(body: dict[str, Any], key: str, path: str, *, default: bool = False) -> bool:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(path, f"must be true or false, got {_show(value)}")
    return value


def json_object_text(text: str, path: str) -> dict[str, Any]:
    """A tool call's `arguments` string, which must hold a JSON object."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise InvalidArgument(path, f"must be a JSON object encoded as a string: {exc}") from exc
    return obj(value, path)
