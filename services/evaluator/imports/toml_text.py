"""Render a task.toml document: strings, numbers, booleans, string lists and tables (pure).

Only what task.toml holds is supported; the writer parses the text back with `tomllib` and
compares, so a value this renders wrongly is refused rather than written.

Example:
    render({"name": "t", "prompt": "one line", "source": {"id": "x"}})
    -> 'name = "t"\\nprompt = "one line"\\n\\n[source]\\nid = "x"\\n'
    A prompt with line breaks is written as a multi-line basic string (three double quotes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

_ESCAPES = {"\\": "\\\\", '"': '\\"', "\b": "\\b", "\t": "\\t", "\f": "\\f", "\r": "\\r"}


def _escape(text: str, *, multiline: bool) -> str:
    out = []
    for i, ch in enumerate(text):
        if ch == '"' and multiline and text[i + 1 : i + 2] not in ('"', ""):
            out.append(ch)  # readable prompts: only a quote that could close the string is escaped
        elif ch == "\n":
            out.append("\n" if multiline else "\\n")
        elif ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def string(text: str) -> str:
    """A TOML basic string; text with line breaks becomes a multi-line string, read back exactly
    (the newline right after the opening quotes is not part of the value)."""
    if "\n" in text:
        return '"""\n' + _escape(text, multiline=True) + '"""'
    return '"' + _escape(text, multiline=False) + '"'


def value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError(f"cannot write {v} in task.toml")
        return repr(v)
    if isinstance(v, str):
        return string(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{key(k)} = {value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write a {type(v).__name__} in task.toml")


def key(k: str) -> str:
    return k if k and all(c.isalnum() or c in "_-" for c in k) and k.isascii() else string(k)


def render(doc: Mapping[str, Any]) -> str:
    """Top-level keys first, then one `[table]` per mapping value (inline tables inside them)."""
    lines = [f"{key(k)} = {value(v)}" for k, v in doc.items() if not isinstance(v, Mapping)]
    for name, table in doc.items():
        if isinstance(table, Mapping):
            lines += ["", f"[{key(name)}]"]
            lines += [f"{key(k)} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"
