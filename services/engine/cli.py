"""`gyre model ...`: create a tiny local checkpoint (shell)."""

from __future__ import annotations

import argparse
import json


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gyre model", description="Local model checkpoints.")
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser(
        "init",
        help="write a tiny Qwen2-architecture checkpoint and tokenizer (random weights, no download)",
    )
    init.add_argument("directory", help="folder to write (created if missing)")
    init.add_argument("--seed", type=int, default=0, help="weights seed; the same seed, the same model")
    init.add_argument("--layers", type=int, default=4, help="transformer layers (default 4)")
    init.add_argument("--hidden-size", type=int, default=128, help="model width (default 128)")
    ns = parser.parse_args(argv)

    from services.engine.model_init import init_model

    out = init_model(ns.directory, seed=ns.seed, num_layers=ns.layers, hidden_size=ns.hidden_size)
    print(json.dumps({"model_dir": str(out), "files": sorted(p.name for p in out.iterdir())}))
    return 0
