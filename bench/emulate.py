"""The emulator's own capacity: memory per emulated cell, and where its engines stop keeping time
(shell; EMULATION ONLY).

    python -m bench.emulate --json [--profile FILE] [--cells N] [--per-cell B] [--tokens T]

Starts N emulated engines of the profile in this process (each on its own gRPC port), then
runs rounds of N x B concurrent streaming generations of T tokens through gRPC at rising
`time_scale`, and compares each round's wall time with what the timing model says it should
take (`modelled_wall_s`). `lag` = measured / modelled; a round with lag over 1.10 means the
emulator, not the modelled accelerator, set the pace: `saturated_at_tokens_per_s` is the first
such round's delivered token rate. The gRPC clients run in this same process, so the figures
are a lower bound on what the engines alone sustain. Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import grpc

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre_app.emulation.cells import EmulatedCells
from gyre_app.emulation.profile import engine_timing, load_profile

DEFAULT_PROFILE = Path(__file__).resolve().parent / "profiles" / "h100-emulated.yaml"
LAG_LIMIT = 1.10
PROMPT_TOKENS = 64


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


async def one_round(stubs: list[Any], *, per_cell: int, tokens: int, tag: str) -> float:
    async def one(stub: Any, i: int) -> int:
        req = engine_pb2.GenerateTokensRequest(
            request_id=f"{tag}-{id(stub)}-{i}",
            execution_id=f"{tag}-{id(stub)}-{i}",
            prompt_ids=[1 + (i + k) % 90 for k in range(PROMPT_TOKENS)],
            sampling=engine_pb2.SamplingParams(max_tokens=tokens),
        )
        n = 0
        async for message in stub.GenerateTokens(req):
            n += len(message.tokens.token_ids)
        return n

    started = time.perf_counter()
    counts = await asyncio.gather(*(one(s, i) for s in stubs for i in range(per_cell)))
    assert all(c == tokens for c in counts), f"a generation ended short: {sorted(set(counts))}"
    return time.perf_counter() - started


async def run(
    profile_path: Path, cells: int, per_cell: int, tokens: int, scales: list[float], tick_s: float
) -> dict[str, Any]:
    profile = load_profile(profile_path)
    timing = engine_timing(profile)
    gc.collect()
    before = rss_bytes()
    host = EmulatedCells(profile)
    # reply_tokens past max_tokens: every generation runs its full T tokens.
    await host.start(
        [f"cell-{i}" for i in range(1, cells + 1)], vocab_size=512, eos_id=2, reply_tokens=tokens + 1
    )
    gc.collect()
    per_cell_bytes = (rss_bytes() - before) / cells
    channels = [grpc.aio.insecure_channel(a) for a in host.addresses.values()]
    stubs = [engine_pb2_grpc.EngineServiceStub(c) for c in channels]
    prefill_s = timing.prefill_s(PROMPT_TOKENS * per_cell)
    decode_s = sum(
        timing.decode_step_s(batch=per_cell, context_tokens=per_cell * (PROMPT_TOKENS + i))
        for i in range(tokens)
    )
    rounds = []
    saturated_at = None
    try:
        for scale in scales:
            for engine in host.engines.values():
                engine.config = type(engine.config)(**{**_fields(engine.config), "time_scale": scale})
            busy_before = host.busy_s()
            wall = await one_round(stubs, per_cell=per_cell, tokens=tokens, tag=f"s{scale:g}")
            modelled = (prefill_s + decode_s) / scale
            delivered = cells * per_cell * tokens / wall
            lag = wall / modelled
            rounds.append(
                {
                    "time_scale": scale,
                    "modelled_wall_s": round(modelled, 3),
                    "wall_s": round(wall, 3),
                    "lag": round(lag, 3),
                    "tokens_per_s": round(delivered),
                    "engine_busy_share": round((host.busy_s() - busy_before) / wall, 3),
                }
            )
            if lag > LAG_LIMIT and saturated_at is None:
                saturated_at = round(delivered)
    finally:
        for c in channels:
            await c.close(None)
        await host.close()
    return {
        "label": "emulation only",
        "profile": profile.name,
        "cells": cells,
        "generations_per_cell": per_cell,
        "tokens_per_generation": tokens,
        "tick_s": tick_s,
        "rss_bytes_per_cell": round(per_cell_bytes),
        "rounds": rounds,
        "lag_limit": LAG_LIMIT,
        "saturated_at_tokens_per_s": saturated_at,
        "clients_in_process": True,
    }


def _fields(config: Any) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--cells", type=int, default=64)
    parser.add_argument("--per-cell", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--scales", default="1,4,16,64", help="time scales to try, comma-separated")
    parser.add_argument("--tick-s", type=float, default=0.02, help="the engines' decode tick (wall seconds)")
    ns = parser.parse_args()
    scales = [float(x) for x in ns.scales.split(",")]
    out = asyncio.run(run(ns.profile, ns.cells, ns.per_cell, ns.tokens, scales, ns.tick_s))
    if not ns.json:
        print(json.dumps(out, indent=1))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
