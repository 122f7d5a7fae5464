"""The command line both sandbox attack benchmarks share (`bench.sandbox`, `bench.unassessable`):
root check, quiet logs, one line per attack, the figures as JSON last, exit 1 unless every
attempt was contained."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any


def attack_main(
    name: str,
    doc: str | None,
    run: Callable[[], Awaitable[dict[str, Any]]],
    *,
    widths: tuple[int, int],
    failed: str,
) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=(doc or "").splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.parse_args()
    from gyre.logs import configure_logging

    configure_logging(level="warning")
    if os.geteuid() != 0:
        print(f"bench.{name}: needs root (sandbox users, namespaces, mounts)", file=sys.stderr)
        return 2
    result = asyncio.run(run())
    via_w, attack_w = widths
    verdict_w = max(len("contained"), len(failed))
    for r in result["results"]:
        verdict = "contained" if r["contained"] else failed
        print(
            f"{r['via']:{via_w}} {r['attack']:{attack_w}} {verdict:{verdict_w}} {r['detail']}  [{r['ended']}]"
        )
    print(json.dumps(result))
    return 0 if result["attempts"] == result["contained"] else 1
