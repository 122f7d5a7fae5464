"""Benchmark of live role switches: satellites moved rollout -> training -> rollout while
generation streams are open on them (shell).

    python -m bench.role_switch --json [--switches 5]

CPU cells with the tiny model (`bench.cell_rig`: scheduler, proxy, trainer, torch engines, cell
agents with warm training workers). For each round, a greedy streaming call runs on each
satellite; once tokens flow, the busy cell is switched to training (its call moves with its KV
to the other satellite) and straight back to rollout, through the scheduler's `SwitchCell`.
Every stream is checked against an undisturbed run of the same greedy call: a stream that fails
or ends early is a lost request; tokens beyond the undisturbed run's count are duplicated
tokens, and a stream whose text differs is counted as mismatched. Prints the median switch times
each way and the phases of the median rollout -> training switch. Uses GYRE_NATS_URL /
GYRE_DATABASE_URL when set, else embedded servers; a fresh database and prefix, removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

import openai

from bench.cell_rig import LiveCells, live_cells
from bench.slice import servers
from gyre.devstack.scratch import scratch_kernel
from gyre.scheduler.v1 import scheduler_pb2 as pb

MESSAGES = [{"role": "user", "content": "Fix the failing test and run the test suite again."}]
MAX_TOKENS = 240


async def one_stream(live: LiveCells, started: asyncio.Event | None = None) -> tuple[str, int, bool]:
    """(text, completion tokens, finished) of one greedy streaming call."""
    client = openai.AsyncOpenAI(
        base_url=f"{live.http_url}/v1", api_key=await live.register_execution(), max_retries=0
    )
    stream = await client.chat.completions.create(  # type: ignore[call-overload]
        model="tiny",
        messages=MESSAGES,
        stream=True,
        temperature=0,
        max_tokens=MAX_TOKENS,
        stream_options={"include_usage": True},
    )
    parts: list[str] = []
    tokens, finished = 0, False
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finished = finished or chunk.choices[0].finish_reason is not None
            if started is not None and len(parts) >= 4:
                started.set()
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return "".join(parts), tokens, finished


async def measure(live: LiveCells, *, switches: int) -> dict[str, object]:
    reference, reference_tokens, _ = await one_stream(live)
    out_s: list[float] = []
    back_s: list[float] = []
    outs: list[pb.CellSwitch] = []
    lost = duplicated = mismatched = failed_switches = 0
    for _ in range(switches):
        started = asyncio.Event()
        streams = [asyncio.ensure_future(one_stream(live, started)) for _ in live.satellites]
        await asyncio.wait_for(started.wait(), timeout=60)
        cell = await live.busy_cell()
        out = await live.switch(cell, pb.CELL_ROLE_TRAINING)
        back = await live.switch(cell, pb.CELL_ROLE_ROLLOUT)
        failed_switches += (not out.ok) + (not back.ok)
        out_s.append(out.total_s)
        back_s.append(back.total_s)
        outs.append(out)
        for result in await asyncio.gather(*streams, return_exceptions=True):
            if isinstance(result, BaseException) or not result[2]:
                lost += 1
                continue
            text, tokens, _ = result
            duplicated += max(0, tokens - reference_tokens)
            mismatched += text != reference
    median_out = sorted(outs, key=lambda s: s.total_s)[len(outs) // 2]
    return {
        "switches_each_way": switches,
        "rollout_to_training_s": statistics.median(out_s),
        "training_to_rollout_s": statistics.median(back_s),
        "rollout_to_training_max_s": max(out_s),
        "training_to_rollout_max_s": max(back_s),
        "median_phases_s": {
            "drain": median_out.drain_s,
            "release": median_out.release_s,
            "join": median_out.join_s,
        },
        "calls_migrated": sum(s.num_calls_migrated for s in outs),
        "kv_transferred_bytes": sum(s.kv_transferred_bytes for s in outs),
        "failed_switches": failed_switches,
        "lost_requests": lost,
        "duplicated_tokens": duplicated,
        "mismatched_streams": mismatched,
        "targets": {
            "rollout_to_training_s": 1.0,
            "training_to_rollout_s": 1.0,
            "lost_requests": 0,
            "duplicated_tokens": 0,
        },
    }


async def main_async(switches: int) -> dict[str, object]:
    from services.engine.model_init import init_model

    nats_url, database_url = servers()
    with tempfile.TemporaryDirectory(prefix="gyre-role-switch-") as tmp:
        model = init_model(Path(tmp) / "model")
        async with scratch_kernel(nats_url, database_url, label="role_switch") as kernel:
            async with live_cells(kernel, model, Path(tmp)) as live:
                return await measure(live, switches=switches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.role_switch", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--switches", type=int, default=5, help="switches each way")
    ns = parser.parse_args(argv)
    result = asyncio.run(main_async(ns.switches))
    if not ns.json:
        for key, value in result.items():
            print(f"{key}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
