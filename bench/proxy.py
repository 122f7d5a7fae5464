"""Benchmark of the request proxy: latency it adds over calling the engine directly, and how many
simultaneous streaming sessions it holds without an error (shell).

    python -m bench.proxy --json

The engine is a scripted EngineService in its own process (fixed reply, no model compute, so
the figures are the proxy's own cost); the proxy runs as `python -m services.proxy` in another.
Latency: the same request, streamed to the end, once straight to the engine over gRPC and once
through the proxy's OpenAI API (rotating over 10 warmed-up executions); added latency is the
per-request difference. Concurrency: N
executions each hold one streaming call open at once (the engine paces tokens); any failed,
truncated or refused stream counts as an error. Uses GYRE_NATS_URL / GYRE_DATABASE_URL when
set, else the embedded servers; runs in a fresh database and bus prefix, removed afterwards.
Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import aiohttp
import asyncpg
import grpc
import nats

from bench.slice import pct, servers
from gyre.db.engine import libpq_url, with_database
from gyre.devstack.embedded import free_port
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc

# Executions the latency requests rotate over. An execution makes many calls; its first one also
# loads what a restarted proxy must remember of it (one Postgres read), paid in the warm-up here.
LATENCY_EXECUTIONS = 10
MESSAGES = [
    {"role": "system", "content": "You are a helpful coding assistant."},
    {"role": "user", "content": "Fix the failing test and run the test suite again."},
]


async def _wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(f"{url}/health") as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"proxy at {url} did not come up")


async def _register(stub: proxy_pb2_grpc.ProxyServiceStub, n: int) -> list[tuple[str, str]]:
    """n fresh executions, each with its own token: (token, execution_id) pairs."""
    tokens = []
    for i in range(n):
        token = "bench-" + secrets.token_hex(20)
        request = proxy_pb2.RegisterExecutionTokenRequest(
            request_id=f"bench-tok-{i}-{token[-6:]}", token=token
        )
        request.execution.execution_id = str(uuid.uuid4())
        request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
        await stub.RegisterExecutionToken(request)  # type: ignore[misc]
        tokens.append((token, request.execution.execution_id))
    return tokens


async def _stream_proxy(http: aiohttp.ClientSession, url: str, token: str, *, max_tokens: int) -> int:
    """Stream one call through the proxy to its end; returns the number of SSE data lines."""
    body = {"model": "tiny", "messages": MESSAGES, "stream": True, "max_tokens": max_tokens, "temperature": 0}
    lines = 0
    async with http.post(
        f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {await resp.text()}")
        async for raw in resp.content:
            if raw.startswith(b"data: "):
                lines += 1
                if raw.startswith(b'data: {"error"'):
                    raise RuntimeError(raw.decode())
    return lines


async def stream_engine(
    stub: engine_pb2_grpc.EngineServiceStub,
    prompt_ids: list[int],
    *,
    max_tokens: int,
    execution_id: str = "bench",
) -> int:
    """One greedy call straight to an engine (no proxy): how many tokens it streamed."""
    request = engine_pb2.GenerateTokensRequest(
        request_id=str(uuid.uuid4()),
        execution_id=execution_id,
        prompt_ids=prompt_ids,
        sampling=engine_pb2.SamplingParams(temperature=0, top_p=1, max_tokens=max_tokens),
    )
    n = 0
    async for message in stub.GenerateTokens(request):  # type: ignore[attr-defined]
        n += len(message.tokens.token_ids)
    return n


def _spawn(
    env: dict[str, str],
    *,
    engine_port: int,
    paced_port: int,
    grpc_port: int,
    output_tokens: int,
    stop_id: int,
    token_interval_s: float,
) -> list[subprocess.Popen[bytes]]:
    """Two scripted engines (unpaced for latency, paced for concurrency) and the proxy."""

    def engine(port: int, interval_s: float) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-m", "bench.scripted_engine", "--port", str(port)]
        argv += [
            "--tokens",
            str(output_tokens),
            "--stop-id",
            str(stop_id),
            "--token-interval-s",
            str(interval_s),
        ]
        return subprocess.Popen(argv, env=env)

    proxy = subprocess.Popen([sys.executable, "-m", "services.proxy", "--port", str(grpc_port)], env=env)
    return [engine(engine_port, 0.0), engine(paced_port, token_interval_s), proxy]


async def measure(
    nats_url: str,
    database_url: str,
    *,
    prefix: str,
    requests: int,
    sessions: int,
    output_tokens: int,
    token_interval_s: float,
) -> dict[str, float | int]:
    from services.engine.model_init import IM_END, build_tokenizer

    model_dir = Path(tempfile.mkdtemp(prefix="gyre-bench-proxy-"))
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(model_dir)  # type: ignore[attr-defined]
    stop_id = tokenizer.convert_tokens_to_ids(IM_END)  # type: ignore[attr-defined]
    # The prompt the proxy renders for MESSAGES, so both paths send the engine the same request.
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)  # type: ignore[attr-defined]
    prompt_ids: list[int] = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    engine_port, paced_port, grpc_port, http_port = free_port(), free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "GYRE_NATS_URL": nats_url,
        "GYRE_DATABASE_URL": database_url,
        "GYRE_BUS_PREFIX": prefix,
        "GYRE_PROXY_MODEL_DIR": str(model_dir),
        "GYRE_PROXY_MODEL_NAME": "tiny",
        "GYRE_PROXY_HTTP_PORT": str(http_port),
        "GYRE_LOG_LEVEL": "warning",
    }
    procs = _spawn(
        env,
        engine_port=engine_port,
        paced_port=paced_port,
        grpc_port=grpc_port,
        output_tokens=output_tokens,
        stop_id=stop_id,
        token_interval_s=token_interval_s,
    )
    url = f"http://127.0.0.1:{http_port}"
    errors = 0
    try:
        await _wait_http(url)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{grpc_port}")
        engine_channel = grpc.aio.insecure_channel(f"127.0.0.1:{engine_port}")
        proxy = proxy_pb2_grpc.ProxyServiceStub(channel)
        engine = engine_pb2_grpc.EngineServiceStub(engine_channel)
        await proxy.RegisterEngine(  # type: ignore[misc]
            proxy_pb2.RegisterEngineRequest(
                request_id=f"bench-engine-{prefix}",
                cell_id="cell-1",
                engine_id="bench-engine",
                address=f"127.0.0.1:{engine_port}",
            )
        )
        tokens = [token for token, _ in await _register(proxy, sessions)]
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as http:
            for _ in range(10):  # warm both paths
                await stream_engine(engine, list(prompt_ids), max_tokens=output_tokens)
                for token in tokens[:LATENCY_EXECUTIONS]:
                    await _stream_proxy(http, url, token, max_tokens=output_tokens)
            added_ms = []
            proxy_pid = procs[-1].pid
            cpu_before = _cpu_s(proxy_pid)
            for i in range(requests):
                t0 = time.perf_counter()
                await stream_engine(engine, list(prompt_ids), max_tokens=output_tokens)
                t1 = time.perf_counter()
                try:
                    token = tokens[i % LATENCY_EXECUTIONS]
                    await _stream_proxy(http, url, token, max_tokens=output_tokens)
                except RuntimeError:
                    errors += 1
                    continue
                t2 = time.perf_counter()
                added_ms.append(((t2 - t1) - (t1 - t0)) * 1000)
            # Includes recording each call (outbox write, JetStream publish), done off the hot path.
            cpu_ms_per_call = (_cpu_s(proxy_pid) - cpu_before) * 1000 / max(requests, 1)

            # Concurrency: route to a second engine that paces its tokens (the first cell is
            # drained), and have every session stream at once; the proxy's routing table says
            # how many calls it held in flight together.
            await proxy.DrainCell(  # type: ignore[misc]
                proxy_pb2.DrainCellRequest(request_id=f"bench-drain-{prefix}", cell_id="cell-1", timeout_s=10)
            )
            await proxy.RegisterEngine(  # type: ignore[misc]
                proxy_pb2.RegisterEngineRequest(
                    request_id=f"bench-paced-{prefix}",
                    cell_id="cell-2",
                    engine_id="paced-engine",
                    address=f"127.0.0.1:{paced_port}",
                )
            )
            peak = 0
            done = asyncio.Event()

            async def watch() -> None:
                nonlocal peak
                while not done.is_set():
                    routing = await proxy.GetRouting(proxy_pb2.GetRoutingRequest())  # type: ignore[misc]
                    peak = max(peak, sum(r.num_in_flight_calls for r in routing.routes))
                    await asyncio.sleep(0.02)

            watcher = asyncio.create_task(watch())

            async def session(token: str) -> None:
                nonlocal errors
                try:
                    lines = await _stream_proxy(http, url, token, max_tokens=output_tokens)
                    if lines < 3:
                        errors += 1
                except Exception:
                    errors += 1

            started = time.perf_counter()
            await asyncio.wait_for(asyncio.gather(*(session(t) for t in tokens)), timeout=300)
            concurrent_s = time.perf_counter() - started
            done.set()
            await watcher
        await channel.close(None)
        await engine_channel.close(None)
    finally:
        _stop(procs)
    return {
        "added_latency_p50_ms": round(pct(added_ms, 0.5), 3),
        "added_latency_p99_ms": round(pct(added_ms, 0.99), 3),
        "requests": len(added_ms),
        "proxy_cpu_ms_per_call": round(cpu_ms_per_call, 3),
        "output_tokens_per_call": output_tokens,
        "concurrent_sessions": peak,
        "concurrent_wall_s": round(concurrent_s, 3),
        "errors": errors,
    }


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextlib.asynccontextmanager
async def scratch_servers(tag: str) -> AsyncIterator[tuple[str, str, str]]:
    """(nats_url, database_url, bus prefix) in a fresh database and bus prefix, removed afterwards."""
    nats_url, admin_url = servers()
    name = f"gyre_bench_{tag}_{uuid.uuid4().hex[:10]}"
    prefix = f"bench{tag}{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(libpq_url(admin_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    try:
        yield nats_url, with_database(admin_url, name), prefix
    finally:
        admin = await asyncpg.connect(libpq_url(admin_url))
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        for info in await js.streams_info():
            stream = info.config.name or ""
            if stream.startswith(prefix.upper()) or stream.startswith(f"OBJ_{prefix}"):
                await js.delete_stream(stream)
        await nc.close()


async def main_async(ns: argparse.Namespace) -> dict[str, float | int]:
    async with scratch_servers("proxy") as (nats_url, database_url, prefix):
        return await measure(
            nats_url,
            database_url,
            prefix=prefix,
            requests=ns.requests,
            sessions=ns.sessions,
            output_tokens=ns.output_tokens,
            token_interval_s=ns.token_interval_s,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="paired latency requests")
    parser.add_argument("--sessions", type=int, default=200, help="simultaneous streaming sessions")
    parser.add_argument("--output-tokens", type=int, default=16, help="tokens per reply")
    parser.add_argument(
        "--token-interval-s", type=float, default=0.1, help="engine pacing in the concurrency phase"
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
