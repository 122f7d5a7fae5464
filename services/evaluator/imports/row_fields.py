"""Read the fields of one dataset row, each problem a refusal naming the field (pure).

Example:
    test_ids({"FAIL_TO_PASS": '["t.py::test_a"]'}, "FAIL_TO_PASS") -> ["t.py::test_a"]
    test_ids({"FAIL_TO_PASS": "t.py::test_a"}, "FAIL_TO_PASS")     -> RowError("FAIL_TO_PASS", ...)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class RowError(Exception):
    """One field of a row is missing or malformed; the importer turns it into a refusal."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


def text(row: Mapping[str, Any], key: str, *, blank_ok: bool = False) -> str:
    """A required string field."""
    if key not in row or row[key] is None:
        raise RowError(key, "is required")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(key, f"must be a string, got {type(value).__name__}")
    if not blank_ok and not value.strip():
        raise RowError(key, "must not be blank")
    return value


def optional_text(row: Mapping[str, Any], *keys: str) -> str:
    """The first of `keys` that holds a non-blank string, or ""; a non-string is refused."""
    for key in keys:
        value = row.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise RowError(key, f"must be a string, got {type(value).__name__}")
        if value.strip():
            return value.strip()
    return ""


def test_ids(row: Mapping[str, Any], key: str) -> list[str]:
    """A list of test ids, given as a list or as a JSON string holding one (SWE-bench's form)."""
    if key not in row or row[key] is None:
        raise RowError(key, "is required (a list of test ids, or a JSON string of one)")
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RowError(key, "must be a list of test ids or a JSON string of one") from None
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        raise RowError(key, "must be a list of non-empty test id strings")
    seen: list[str] = []
    for t in value:
        if t not in seen:
            seen.append(t)
    return seen


def json_object(row: Mapping[str, Any], key: str) -> dict[str, Any]:
    """A field that holds an object, or a JSON string of one (R2E-Gym's form)."""
    if key not in row or row[key] is None:
        raise RowError(key, "is required")
    value = row[key]
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise RowError(key, "must be a JSON object (or a string holding one)") from None
    if not isinstance(value, dict):
        raise RowError(key, f"must be a JSON object, got {type(value).__name__}")
    return value
