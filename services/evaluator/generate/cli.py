"""`gyre tasks generate --family F --count N --seed S --out DIR`: write a seeded task set (shell).

Exit code 0 with the manifest as JSON on stdout; 2 for bad input (unknown family, a count below
1, a folder that exists or cannot be written), with nothing written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from gyre.errors import GyreError
from services.evaluator.generate.families import GENERATORS, parse_families, plan
from services.evaluator.generate.writer import write_taskset


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gyre tasks", description="Generate seeded task sets.")
    sub = parser.add_subparsers(dest="action", required=True)
    gen = sub.add_parser("generate", help="write N instances per family with train/heldout splits")
    gen.add_argument(
        "--family", required=True, help=f"{', '.join(GENERATORS)}, several separated by commas, or all"
    )
    gen.add_argument("--count", type=int, required=True, help="instances per family (every 4th held out)")
    gen.add_argument("--seed", type=int, default=0, help="the same seed writes the same set")
    gen.add_argument("--out", type=Path, required=True, help="a new or empty folder")
    ns = parser.parse_args(argv)
    try:
        manifest = write_taskset(ns.out, plan(parse_families(ns.family), count=ns.count), seed=ns.seed)
    except GyreError as exc:
        print(f"gyre tasks generate: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out": str(ns.out), **manifest}))
    return 0
