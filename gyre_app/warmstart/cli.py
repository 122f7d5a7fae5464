"""`gyre model init DIR --warm-start [--seed N] [--steps N]`: install the warm-started tiny model (shell).

The plain `gyre model init` (random weights) belongs to the engine service; with `--warm-start`
the application builds the model from every service's parts (see `build`), so `gyre_app.cli`
routes the command here. Prints one JSON object: the folder, whether it was built or reused
from the cache, and the build's summary.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from gyre.settings import KernelSettings


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gyre model init", description="Install a warm-started tiny model.")
    parser.add_argument("init", choices=["init"])
    parser.add_argument("directory", type=Path, help="model folder to write (e.g. .gyre/model)")
    parser.add_argument("--warm-start", action="store_true", required=True)
    parser.add_argument("--seed", type=int, default=0, help="the same seed builds the same model")
    parser.add_argument("--steps", type=int, default=None, help="supervised steps (default 70)")
    parser.add_argument(
        "--count",
        type=int,
        default=None,
        help="instances of every family (default 12 repo-gen, 12 repair, 96 terminal)",
    )
    ns = parser.parse_args(argv)
    from gyre_app.warmstart.build import WarmStartConfig, cached_warm_start, each, install

    config = WarmStartConfig(seed=ns.seed)
    if ns.steps is not None:
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, steps=ns.steps))
    if ns.count is not None:
        config = dataclasses.replace(config, counts=each([f for f, _ in config.counts], ns.count))
    if config.train.steps < 1 or min(n for _, n in config.counts) < 4:
        print("gyre model init: --steps must be >= 1 and --count >= 4", file=sys.stderr)
        return 2
    folder, built = cached_warm_start(
        KernelSettings().state_dir,
        config,
        say=lambda m: print(f"warm start: {m}", file=sys.stderr, flush=True),
    )
    install(folder, ns.directory)
    summary = json.loads((folder / "warmstart.json").read_text())
    print(
        json.dumps(
            {"model_dir": str(ns.directory), "cache": str(folder), "built": built, "train": summary["train"]}
        )
    )
    return 0
