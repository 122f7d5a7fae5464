"""How the `gyre` command prints: one JSON object with `--json`, rich tables otherwise (shell)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from google.protobuf import json_format, message
from rich.console import Console
from rich.table import Table

console = Console(highlight=False, soft_wrap=True)
JSON_HELP = "print one JSON object (machine-readable) instead of tables"


def message_dict(m: message.Message) -> dict[str, Any]:
    """A proto as a JSON-ready dict with the proto's own field names, defaults included."""
    return json_format.MessageToDict(
        m, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def print_json(data: Any) -> None:
    print(json.dumps(data, sort_keys=False, default=str))


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c, overflow="fold")  # ids are copied from here: never cut them
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    console.print(t)


def pairs(title: str, items: Iterable[tuple[str, Any]]) -> None:
    table(title, ("field", "value"), items)
