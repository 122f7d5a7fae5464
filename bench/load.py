"""Load benchmark of the proxy: hundreds of executions streaming at once, none lost (shell).

    python -m bench.load --json

`--sessions` executions (500 by default), each with its own execution token, run at once; each
makes `--calls` streaming calls through the proxy's OpenAI-compatible HTTP API, every call's
messages extending the previous call's conversation with its reply (a multi-call session). The
proxy (`python -m services.proxy`, its own process) routes them over loopback gRPC to
`--engines` engine processes.

The engines are `bench.scripted_engine`: they serve the real EngineService gRPC contract
(GenerateTokens streams, pause/export/import/resume, stats) with a fixed reply paced at one
token every `--token-interval-s`, but compute no model. A torch engine on this machine's cores
cannot serve 500 streams at once, and what is measured here is the proxy's capacity, so the
engines' own cost is kept out (the JSON says so in `engine`).

Figures:
- `sessions`, `sessions_completed`, `errors` (a refused, failed or truncated call);
- `lost_calls`: calls a harness was answered (its stream reached `[DONE]`) that are missing from
  the durable record: per execution, the count RevokeExecutionToken answers (what the runner
  passes on), and the LlmCallRecorded events in the proxy's JetStream stream;
- throughput in calls and tokens per second over the load phase;
- added latency: the same sessions (same concurrency, calls and token counts) run straight
  against the engines over gRPC first; `added_latency_p99_ms` is the p99 of a call's latency
  through the proxy minus the p99 straight to the engines (p50 likewise);
- `proxy_peak_rss_mib`: the proxy process's peak resident memory (VmHWM);
- `proxy_cpu_ms_per_call`: the proxy's CPU time over the load phase per call answered (recording
  included): with the clients, engines, NATS and Postgres on the same cores, the proxy is
  CPU-bound under this load, and latency beyond the engine's is mostly waiting for a core.

Bounded: the whole load phase has `--timeout-s`. Uses GYRE_NATS_URL / GYRE_DATABASE_URL when
set, else the embedded servers, in a fresh database and bus prefix removed afterwards. Prints
one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc
import nats

from bench.proxy import MESSAGES, _cpu_s, _register, _stop, _wait_http, scratch_servers, stream_engine
from bench.slice import pct
from gyre.common.v1 import envelope_pb2
from gyre.devstack.embedded import free_port
from gyre.engine.v1 import engine_pb2_grpc
from gyre.events import stream_name
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc

ENGINE_NOTE = (
    "bench.scripted_engine: the EngineService gRPC contract with a fixed, paced reply and no model "
    "compute; the figures are the proxy's capacity, not a model's"
)


class CallFailed(Exception):
    pass


async def _proxy_call(
    http: aiohttp.ClientSession, url: str, token: str, messages: list[dict[str, str]], *, max_tokens: int
) -> tuple[str, int]:
    """One streamed call to `[DONE]`; returns the reply text and the number of content chunks."""
    body = {"model": "tiny", "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": 0}
    parts: list[str] = []
    done = False
    async with http.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        if resp.status != 200:
            raise CallFailed(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            if not raw.startswith(b"data: "):
                continue
            data = raw[6:].strip()
            if data == b"[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise CallFailed(str(chunk["error"])[:200])
            for choice in chunk.get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    if not done:
        raise CallFailed("stream ended before [DONE]")
    return "".join(parts), len(parts)


def _next_messages(messages: list[dict[str, str]], reply: str, k: int) -> list[dict[str, str]]:
    return [
        *messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": f"Step {k}: go on."},
    ]


async def engines_alone(
    addresses: list[str],
    prompt_ids: list[int],
    *,
    sessions: int,
    calls: int,
    max_tokens: int,
    timeout_s: float,
) -> list[float]:
    """Per-call latencies (s) of the same sessions straight to the engines, prompts growing per call."""
    channels = [grpc.aio.insecure_channel(a) for a in addresses]
    stubs = [engine_pb2_grpc.EngineServiceStub(c) for c in channels]
    latencies: list[float] = []

    async def session(i: int) -> None:
        prompt = list(prompt_ids)
        for _ in range(calls):
            t0 = time.perf_counter()
            await stream_engine(
                stubs[i % len(stubs)], prompt, max_tokens=max_tokens, execution_id="bench-load"
            )
            latencies.append(time.perf_counter() - t0)
            prompt += [100 + j for j in range(max_tokens + 8)]

    try:
        await asyncio.wait_for(asyncio.gather(*(session(i) for i in range(sessions))), timeout=timeout_s)
    finally:
        for channel in channels:
            await channel.close(None)
    return latencies


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _recorded_events(nats_url: str, prefix: str) -> dict[str, int]:
    """LlmCallRecorded events per execution in the proxy's stream."""
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        stream = stream_name("proxy", prefix=prefix)
        sub = await js.pull_subscribe(f"{prefix}.proxy.v1.LlmCallRecorded", durable=None, stream=stream)
        counts: dict[str, int] = {}
        for _ in range(100_000):  # bounded: stops at the stream's end
            try:
                msgs = await sub.fetch(500, timeout=2)
            except TimeoutError:
                break
            for msg in msgs:
                envelope = envelope_pb2.Envelope()
                envelope.ParseFromString(msg.data)
                # The recorder names the call's execution as the event's correlation id.
                counts[envelope.correlation_id] = counts.get(envelope.correlation_id, 0) + 1
                await msg.ack()
        return counts
    finally:
        await nc.close()


async def _revoke_all(proxy: proxy_pb2_grpc.ProxyServiceStub, executions: list[str]) -> dict[str, int]:
    """What RevokeExecutionToken answers per execution: the calls the proxy durably recorded."""
    counts: dict[str, int] = {}
    for execution_id in executions:
        answer = await proxy.RevokeExecutionToken(  # type: ignore[misc]
            proxy_pb2.RevokeExecutionTokenRequest(
                request_id=f"load-revoke-{execution_id}", execution_id=execution_id
            )
        )
        counts[execution_id] = answer.num_calls_recorded
    return counts


def _spawn_engines(
    env: dict[str, str], ports: list[int], *, tokens: int, stop_id: int, interval_s: float
) -> list[subprocess.Popen[bytes]]:
    argv = [sys.executable, "-m", "bench.scripted_engine", "--tokens", str(tokens), "--stop-id", str(stop_id)]
    argv += ["--token-interval-s", str(interval_s)]
    return [subprocess.Popen([*argv, "--port", str(port)], env=env) for port in ports]


async def measure(nats_url: str, database_url: str, prefix: str, ns: argparse.Namespace) -> dict[str, object]:
    from services.engine.model_init import IM_END, build_tokenizer

    model_dir = Path(tempfile.mkdtemp(prefix="gyre-bench-load-"))
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)  # type: ignore[attr-defined]
    stop_id = tokenizer.convert_tokens_to_ids(IM_END)  # type: ignore[attr-defined]
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    prompt_ids: list[int] = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    engine_ports = [free_port() for _ in range(ns.engines)]
    grpc_port, http_port = free_port(), free_port()
    env = {
        **os.environ,
        "GYRE_NATS_URL": nats_url,
        "GYRE_DATABASE_URL": database_url,
        "GYRE_BUS_PREFIX": prefix,
        "GYRE_PROXY_MODEL_DIR": str(model_dir),
        "GYRE_PROXY_MODEL_NAME": "tiny",
        "GYRE_PROXY_HTTP_PORT": str(http_port),
        "GYRE_LOG_LEVEL": "warning",
        "GYRE_PROXY_PROCESSES": str(ns.proxies),
    }
    procs = _spawn_engines(
        env, engine_ports, tokens=ns.output_tokens, stop_id=stop_id, interval_s=ns.token_interval_s
    )
    proxy_proc = subprocess.Popen([sys.executable, "-m", "services.proxy", "--port", str(grpc_port)], env=env)  # noqa: ASYNC220
    procs.append(proxy_proc)
    url = f"http://127.0.0.1:{http_port}"
    addresses = [f"127.0.0.1:{port}" for port in engine_ports]
    errors: list[str] = []
    proxy_latencies: list[float] = []
    answered: dict[str, int] = {}
    chunks = 0
    try:
        await _wait_http(url, timeout_s=300)  # a loaded machine imports slowly
        baseline = await engines_alone(
            addresses,
            prompt_ids,
            sessions=ns.sessions,
            calls=ns.calls,
            max_tokens=ns.output_tokens,
            timeout_s=ns.timeout_s,
        )
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        proxy = proxy_pb2_grpc.ProxyServiceStub(channel)
        for i, address in enumerate(addresses):
            await proxy.RegisterEngine(  # type: ignore[misc]
                proxy_pb2.RegisterEngineRequest(
                    request_id=f"load-engine-{i}",
                    cell_id=f"cell-{i + 1}",
                    engine_id=f"engine-{i + 1}",
                    address=address,
                )
            )
        pairs = await _register(proxy, ns.sessions)
        tokens, executions = [t for t, _ in pairs], [e for _, e in pairs]
        peak = 0
        done = asyncio.Event()

        async def watch() -> None:
            nonlocal peak
            while not done.is_set():
                routing = await proxy.GetRouting(proxy_pb2.GetRoutingRequest())  # type: ignore[misc]
                peak = max(peak, sum(r.num_in_flight_calls for r in routing.routes))
                await asyncio.sleep(0.05)

        async def session(http: aiohttp.ClientSession, token: str, execution_id: str) -> None:
            nonlocal chunks
            messages = list(MESSAGES)
            answered[execution_id] = 0
            for k in range(ns.calls):
                t0 = time.perf_counter()
                try:
                    reply, n = await _proxy_call(http, url, token, messages, max_tokens=ns.output_tokens)
                except (CallFailed, aiohttp.ClientError, json.JSONDecodeError) as exc:
                    errors.append(repr(exc)[:200])
                    return
                proxy_latencies.append(time.perf_counter() - t0)
                answered[execution_id] += 1
                chunks += n
                messages = _next_messages(messages, reply, k + 1)

        watcher = asyncio.create_task(watch())
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        started, cpu_before = time.perf_counter(), _tree_cpu_s(proxy_proc.pid)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            runs = [session(http, t, e) for t, e in zip(tokens, executions, strict=True)]
            try:
                await asyncio.wait_for(asyncio.gather(*runs), timeout=ns.timeout_s)
            except TimeoutError:
                errors.append(f"load phase passed --timeout-s {ns.timeout_s}")
        load_s, proxy_cpu_s = time.perf_counter() - started, _tree_cpu_s(proxy_proc.pid) - cpu_before
        done.set()
        await watcher
        recorded = await _revoke_all(proxy, executions)
        await channel.close(None)
        events: dict[str, int] = {}
        for _ in range(20):  # the outbox relay publishes what is durable within moments
            events = await _recorded_events(nats_url, prefix)
            if all(events.get(e, 0) >= n for e, n in answered.items()):
                break
            await asyncio.sleep(0.5)
        peak_rss = _peak_rss_mib(proxy_proc.pid)
    finally:
        _stop(procs)
    lost_record = sum(max(0, n - recorded.get(e, 0)) for e, n in answered.items())
    lost_events = sum(max(0, n - events.get(e, 0)) for e, n in answered.items())
    num_calls = sum(answered.values())
    return {
        "proxies": ns.proxies,
        "sessions": ns.sessions,
        "sessions_completed": sum(1 for n in answered.values() if n == ns.calls),
        "calls_per_session": ns.calls,
        "calls_answered": num_calls,
        "errors": len(errors),
        "lost_calls": max(lost_record, lost_events),
        "lost_calls_revoke_count": lost_record,
        "lost_calls_events": lost_events,
        "peak_in_flight_calls": peak,
        "load_wall_s": round(load_s, 2),
        "calls_per_s": round(num_calls / load_s, 1),
        "tokens_per_s": round(num_calls * ns.output_tokens / load_s, 1),
        "call_latency_p50_ms": round(pct(proxy_latencies, 0.5) * 1000, 1) if proxy_latencies else None,
        "call_latency_p99_ms": round(pct(proxy_latencies, 0.99) * 1000, 1) if proxy_latencies else None,
        "engine_alone_p50_ms": round(pct(baseline, 0.5) * 1000, 1),
        "engine_alone_p99_ms": round(pct(baseline, 0.99) * 1000, 1),
        "added_latency_p50_ms": round((pct(proxy_latencies, 0.5) - pct(baseline, 0.5)) * 1000, 1)
        if proxy_latencies
        else None,
        "added_latency_p99_ms": round((pct(proxy_latencies, 0.99) - pct(baseline, 0.99)) * 1000, 1)
        if proxy_latencies
        else None,
        "proxy_peak_rss_mib": round(peak_rss, 1),
        "proxy_cpu_ms_per_call": round(proxy_cpu_s * 1000 / max(num_calls, 1), 2),
        "engines": ns.engines,
        "output_tokens_per_call": ns.output_tokens,
        "token_interval_s": ns.token_interval_s,
        "engine": ENGINE_NOTE,
        "first_errors": errors[:3],
    }


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of the proxy and of the proxy processes it started (`--proxies` > 1)."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    total = _cpu_s(pid)
    for child in children:
        try:
            total += _cpu_s(int(child))
        except (OSError, IndexError, ValueError):  # it exited meanwhile
            pass
    return total


async def main_async(ns: argparse.Namespace) -> dict[str, object]:
    """One run per `--proxies` count, the same load each; calls/s ratios against the first run."""
    runs: dict[str, dict[str, object]] = {}
    for i, count in enumerate(ns.proxy_counts):
        ns.proxies = count
        # A count given twice (1,2,1,2: interleaved repeats) is keyed by its place too.
        key = str(count) if str(count) not in runs else f"{count}@{i}"
        async with scratch_servers("load") as (nats_url, database_url, prefix):
            runs[key] = await measure(nats_url, database_url, prefix, ns)
    if len(runs) == 1:
        return next(iter(runs.values()))
    first = runs[str(ns.proxy_counts[0])]
    return {
        "by_proxies": runs,
        "calls_per_s_ratio": {
            k: round(float(r["calls_per_s"]) / max(float(first["calls_per_s"]), 1e-9), 3)  # type: ignore[arg-type]
            for k, r in runs.items()
        },
        "errors": sum(int(r["errors"]) for r in runs.values()),  # type: ignore[call-overload]
        "lost_calls": sum(int(r["lost_calls"]) for r in runs.values()),  # type: ignore[call-overload]
        "cpu_cores": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=500, help="executions streaming at once")
    parser.add_argument("--calls", type=int, default=3, help="calls per execution, one after another")
    parser.add_argument("--engines", type=int, default=2, help="scripted engine processes")
    parser.add_argument("--output-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument("--token-interval-s", type=float, default=0.1, help="engine pacing per token")
    parser.add_argument("--timeout-s", type=float, default=300, help="bound on each phase")
    parser.add_argument(
        "--proxies",
        default="1",
        help="proxy processes serving the one address (GYRE_PROXY_PROCESSES); a list such as 1,2"
        " runs the load once per count and prints calls/s ratios",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON line")
    ns = parser.parse_args(argv)
    try:
        ns.proxy_counts = [int(c) for c in ns.proxies.split(",")]
    except ValueError:
        ns.proxy_counts = []
    if not ns.proxy_counts or min(ns.proxy_counts) < 1:
        parser.error(f"--proxies must be counts >= 1 separated by commas, got {ns.proxies!r}")
    result = asyncio.run(main_async(ns))
    if not ns.json:
        for key, value in result.items():
            print(f"{key:>26}: {value}")
    print(json.dumps(result))
    return 0 if result["errors"] == 0 and result["lost_calls"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
