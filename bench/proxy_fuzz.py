"""Benchmark of the proxy against hostile harness input: does any body get a 5xx, and how much does
one execution sending the heaviest requests the proxy accepts slow another execution's calls (shell).

    python -m bench.proxy_fuzz --json

The proxy runs as `python -m services.proxy` in its own process with a scripted engine behind it
(fixed reply, no model compute: the figures are the proxy's own cost), on the tiny tokenizer
with a 4096-token window, so the early size bound is 4096 x 16 = 65,536 characters.

Fuzz: `--examples` hypothesis-generated OpenAI and Anthropic bodies (`bench.proxy_bodies`: valid,
near-valid and hostile), each sent to its endpoint; `responses_5xx` counts answers >= 500
(target 0).

Neighbour: execution A makes small streaming calls one after another; execution B meanwhile
keeps `--flood-connections` requests open, each the largest body the early bound lets through (a
tool description of nearly 65,536 characters: rendered and tokenised whole, then refused for
its token count, the most work one request can make the proxy do). The control floods the same
way with bodies just over the bound (refused before rendering): what the same request rate costs
A with no rendering at all. Each round measures A alone (twice, half as many calls each), beside
the heavy flood and beside the control, the floods' order alternating between rounds, so drift on
a shared machine hits every phase. `neighbour_slowdown_p99` is the median over rounds of A's p99
beside the heavy flood over its p99 alone in the same round (target <= 1.5; paired and
repeated: one round hit by another load on the machine moves it little);
`neighbour_slowdown_p99_cheap_flood` the same beside the control, `_rounds` each round's ratio,
`neighbour_slowdown_p99_pooled` the unpaired ratio over all rounds (the older figure). Uses
GYRE_NATS_URL / GYRE_DATABASE_URL when set, else the embedded servers; runs in a fresh database
and bus prefix. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from hypothesis import HealthCheck, given, settings

from bench.proxy import _register, _spawn, _stop, _wait_http, scratch_servers
from bench.proxy_bodies import bodies, largest_accepted
from bench.slice import pct
from gyre.devstack.embedded import free_port
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc

WINDOW_TOKENS = 4096
MAX_TOKEN_CHARS = 16
MAX_CHARS = WINDOW_TOKENS * MAX_TOKEN_CHARS
PATHS = {"openai": "/v1/chat/completions", "anthropic": "/v1/messages"}
SMALL = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Fix the failing test and run the test suite again."}],
    "stream": True,
    "max_tokens": 16,
    "temperature": 0,
}


def fuzz(url: str, token: str, *, examples: int) -> tuple[int, int, dict[str, int]]:
    """(requests, responses >= 500, answers by 'kind status')."""
    host, port = url.removeprefix("http://").split(":")
    statuses: Counter[str] = Counter()

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(openai=bodies("openai", max_chars=MAX_CHARS), anthropic=bodies("anthropic", max_chars=MAX_CHARS))
    def send(openai: tuple[str, bytes], anthropic: tuple[str, bytes]) -> None:
        for dialect, (kind, body) in (("openai", openai), ("anthropic", anthropic)):
            conn = http.client.HTTPConnection(host, int(port), timeout=120)
            try:
                headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
                conn.request("POST", PATHS[dialect], body=body, headers=headers)
                resp = conn.getresponse()
                resp.read()
                statuses[f"{kind} {resp.status}"] += 1
            finally:
                conn.close()

    send()
    requests = sum(statuses.values())
    failures = sum(n for key, n in statuses.items() if int(key.rsplit(" ", 1)[1]) >= 500)
    return requests, failures, dict(sorted(statuses.items()))


async def _small_call(http: aiohttp.ClientSession, url: str, token: str) -> float:
    """One well-behaved streaming call to its end; its latency in seconds."""
    started = time.perf_counter()
    async with http.post(
        f"{url}{PATHS['openai']}", json=SMALL, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for _ in resp.content:
            pass
    return time.perf_counter() - started


def _flood(url: str, token: str, heavy: bool, connections: int, on: Any, quit: Any, answers: Any) -> None:
    """Execution B, in its own process (so A's client loop is not the one kept busy), for the
    whole run: while `on` is set, keep `connections` requests in flight, each the largest body the
    early bound lets through (`heavy`), or for the control one just over it (refused before any
    rendering); idle while it is clear; gone once `quit` is set. `answers[0]` counts answers below
    500, `answers[1]` the others, `answers[2]` is the requests in flight."""
    max_chars = MAX_CHARS if heavy else MAX_CHARS + 400
    payloads = {d: largest_accepted(d, max_chars=max_chars) for d in ("openai", "anthropic")}  # type: ignore[arg-type]
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    async def one(i: int, http: aiohttp.ClientSession) -> None:
        dialect = "openai" if i % 2 == 0 else "anthropic"
        while not quit.is_set():
            if not on.is_set():
                await asyncio.sleep(0.02)
                continue
            with answers.get_lock():
                answers[2] += 1
            try:
                async with http.post(f"{url}{PATHS[dialect]}", data=payloads[dialect], headers=headers) as r:
                    await r.read()
                    status = r.status
            finally:
                with answers.get_lock():
                    answers[2] -= 1
            with answers.get_lock():
                answers[0 if status < 500 else 1] += 1

    async def run() -> None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            await asyncio.gather(*(one(i, http) for i in range(connections)))

    asyncio.run(run())


def median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def paired_ratios(rounds: list[dict[str, list[float]]], flood: str, q: float) -> list[float]:
    """Per round, A's q-quantile latency beside `flood` over its q-quantile alone in the same round
    (paired: the machine's drift between rounds cancels).

    Example: rounds [{"alone": [1, 1, 2], "heavy": [2, 2, 3]}], "heavy", 0.99 -> [1.5]
    """
    return [pct(r[flood], q) / pct(r["alone"], q) for r in rounds]


async def neighbour(
    url: str, calm: str, noisy: str, *, rounds: int, calls_per_round: int, connections: int
) -> dict[str, Any]:
    """A's latencies alone, beside B's heavy flood and beside B's cheap flood (the control), in
    rounds: each round measures A alone twice and beside each flood once, the floods' order
    alternating between rounds. The figures are medians over rounds of per-round ratios, so one
    round hit by a neighbour on the machine moves them little."""
    spawn = multiprocessing.get_context("spawn")
    quit = spawn.Event()
    answers = {kind: spawn.Array("q", 3) for kind in ("heavy", "cheap")}
    switches = {kind: spawn.Event() for kind in ("heavy", "cheap")}
    flooders = {
        kind: spawn.Process(
            target=_flood,
            args=(url, noisy, kind == "heavy", connections, switches[kind], quit, answers[kind]),
        )
        for kind in ("heavy", "cheap")
    }
    for flooder in flooders.values():
        flooder.start()
    per_round: list[dict[str, list[float]]] = []
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            for _ in range(5):
                await _small_call(http, url, calm)
            for i in range(rounds):
                latencies: dict[str, list[float]] = {"alone": [], "heavy": [], "cheap": []}
                floods = ("heavy", "cheap") if i % 2 == 0 else ("cheap", "heavy")
                for phase in ("alone", floods[0], "alone", floods[1]):
                    if phase != "alone":
                        await _flowing(switches[phase], answers[phase], connections)
                    # A alone twice a round, half as many calls each: every quantile compared
                    # comes from samples of the same size.
                    for _ in range(calls_per_round // 2 if phase == "alone" else calls_per_round):
                        latencies[phase].append(await _small_call(http, url, calm))
                    if phase != "alone":
                        switches[phase].clear()
                        await _drained(answers[phase])
                per_round.append(latencies)
    finally:
        quit.set()
        for flooder in flooders.values():
            await asyncio.to_thread(flooder.join, 60)
            if flooder.is_alive():
                flooder.kill()
    pooled = {k: [v for r in per_round for v in r[k]] for k in ("alone", "heavy", "cheap")}
    heavy99, cheap99 = paired_ratios(per_round, "heavy", 0.99), paired_ratios(per_round, "cheap", 0.99)
    return {
        "neighbour_slowdown_p99": round(median(heavy99), 3),
        "neighbour_slowdown_p99_cheap_flood": round(median(cheap99), 3),
        "neighbour_slowdown_p99_rounds": [round(x, 2) for x in heavy99],
        "neighbour_slowdown_p99_cheap_flood_rounds": [round(x, 2) for x in cheap99],
        "neighbour_slowdown_p50": round(median(paired_ratios(per_round, "heavy", 0.5)), 3),
        "neighbour_slowdown_p50_cheap_flood": round(median(paired_ratios(per_round, "cheap", 0.5)), 3),
        "neighbour_slowdown_p99_pooled": round(pct(pooled["heavy"], 0.99) / pct(pooled["alone"], 0.99), 3),
        "neighbour_p99_ms": {k: round(pct(v, 0.99) * 1000, 1) for k, v in pooled.items()},
        "neighbour_p50_ms": {k: round(pct(v, 0.5) * 1000, 1) for k, v in pooled.items()},
        "neighbour_calls": sum(len(v) for v in pooled.values()),
        "flood_requests": {k: a[0] + a[1] for k, a in answers.items()},
        "flood_responses_5xx": sum(a[1] for a in answers.values()),
    }


async def _drained(answers: Any) -> None:
    """Wait until a flood switched off has had its last requests answered."""
    for _ in range(1200):  # bounded: 120 s
        if answers[2] == 0:
            return
        await asyncio.sleep(0.1)


async def _flowing(switch: Any, answers: Any, connections: int, *, at_most_s: float = 5.0) -> None:
    """Turn a flood on and wait until it answers at its pace: as many answers as connections, or
    `at_most_s` (a proxy that makes a refused execution wait answers it slowly: that is its pace)."""
    before = answers[0] + answers[1]
    switch.set()
    for _ in range(int(at_most_s / 0.1)):  # bounded
        if answers[0] + answers[1] - before >= connections:
            return
        await asyncio.sleep(0.1)


async def measure(nats_url: str, database_url: str, *, prefix: str, ns: argparse.Namespace) -> dict[str, Any]:
    from services.engine.model_init import IM_END, build_tokenizer

    model_dir = Path(tempfile.mkdtemp(prefix="gyre-bench-proxy-fuzz-"))
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)  # type: ignore[attr-defined]
    stop_id = tokenizer.convert_tokens_to_ids(IM_END)  # type: ignore[attr-defined]
    engine_port, spare_port, grpc_port, http_port = free_port(), free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "GYRE_NATS_URL": nats_url,
        "GYRE_DATABASE_URL": database_url,
        "GYRE_BUS_PREFIX": prefix,
        "GYRE_PROXY_MODEL_DIR": str(model_dir),
        "GYRE_PROXY_MODEL_NAME": "tiny",
        "GYRE_PROXY_HTTP_PORT": str(http_port),
        "GYRE_PROXY_CONTEXT_WINDOW_TOKENS": str(WINDOW_TOKENS),
        "GYRE_LOG_LEVEL": "warning",
    }
    if ns.renders_per_execution:
        env["GYRE_PROXY_RENDERS_PER_EXECUTION"] = str(ns.renders_per_execution)
    if ns.refusal_wait_max_s is not None:
        env["GYRE_PROXY_REFUSAL_WAIT_MAX_S"] = str(ns.refusal_wait_max_s)
    procs = _spawn(
        env,
        engine_port=engine_port,
        paced_port=spare_port,
        grpc_port=grpc_port,
        output_tokens=16,
        stop_id=stop_id,
        token_interval_s=0.0,
    )
    url = f"http://127.0.0.1:{http_port}"
    try:
        await _wait_http(url)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        proxy = proxy_pb2_grpc.ProxyServiceStub(channel)
        await proxy.RegisterEngine(  # type: ignore[misc]
            proxy_pb2.RegisterEngineRequest(
                request_id=f"fuzz-engine-{prefix}",
                cell_id="cell-1",
                engine_id="fuzz-engine",
                address=f"127.0.0.1:{engine_port}",
            )
        )
        (fuzzer, _), (calm, _), (noisy, _) = await _register(proxy, 3)
        requests, failures, statuses = await asyncio.to_thread(fuzz, url, fuzzer, examples=ns.examples)
        result: dict[str, Any] = {
            "requests": requests,
            "responses_5xx": failures,
            "load_average": os.getloadavg()[0],
        }
        result.update(
            await neighbour(
                url,
                calm,
                noisy,
                rounds=ns.rounds,
                calls_per_round=ns.calls_per_round,
                connections=ns.flood_connections,
            )
        )
        result["fuzz_answers"] = statuses
        await channel.close(None)
    finally:
        _stop(procs)
    return result


async def main_async(ns: argparse.Namespace) -> dict[str, Any]:
    async with scratch_servers("proxyfuzz") as (nats_url, database_url, prefix):
        return await measure(nats_url, database_url, prefix=prefix, ns=ns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy_fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=300, help="hypothesis examples (2 bodies each)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="rounds of alone, heavy flood, alone, cheap flood (odd: one median)",
    )
    parser.add_argument("--calls-per-round", type=int, default=60, help="A's calls in each phase of a round")
    parser.add_argument("--flood-connections", type=int, default=32, help="B's requests open at once")
    parser.add_argument(
        "--renders-per-execution", type=int, default=0, help="the proxy's setting (0: its default)"
    )
    parser.add_argument(
        "--refusal-wait-max-s",
        type=float,
        default=None,
        help="the proxy's setting (0: a refused execution never waits; default: the proxy's)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    result = asyncio.run(main_async(ns))
    if not ns.json:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
