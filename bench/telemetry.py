"""What telemetry costs: a unary gRPC call with and without the telemetry interceptor, one trace
hop, one scrape (shell).

    python -m bench.telemetry --json

In-process and loopback only; no NATS or Postgres. Calls alternate between two servers that
differ only in the interceptor (the same process, the same load), so the difference of the
medians is the interceptor's cost per call. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import urllib.request
from typing import Any

import grpc

from gyre.metrics import serve_metrics
from gyre.rpc import ErrorInterceptor, GrpcServer
from gyre.tracing import continued_from

CALLER = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}


async def echo(request: bytes, context: Any) -> bytes:
    return request


def _handlers() -> tuple[grpc.GenericRpcHandler, ...]:
    handler = grpc.unary_unary_rpc_method_handler(echo, lambda b: b, lambda b: b)
    return (grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler}),)


async def call_latencies(calls: int) -> dict[str, list[float]]:
    with_telemetry = GrpcServer(service_names=["bench.Echo"])
    with_telemetry.server.add_generic_rpc_handlers(_handlers())
    await with_telemetry.start()
    plain = grpc.aio.server(interceptors=[ErrorInterceptor()])
    plain.add_generic_rpc_handlers(_handlers())
    plain_port = plain.add_insecure_port("127.0.0.1:0")
    await plain.start()
    samples: dict[str, list[float]] = {"telemetry": [], "plain": []}
    try:
        async with (
            grpc.aio.insecure_channel(with_telemetry.address) as a,
            grpc.aio.insecure_channel(f"127.0.0.1:{plain_port}") as b,
        ):
            stubs = {
                "telemetry": a.unary_unary("/bench.Echo/Echo", lambda x: x, lambda x: x),
                "plain": b.unary_unary("/bench.Echo/Echo", lambda x: x, lambda x: x),
            }
            for _ in range(50):  # warm both channels
                for stub in stubs.values():
                    await stub(b"x")
            for _ in range(calls):
                for name, stub in stubs.items():
                    started = time.perf_counter()
                    await stub(b"x", metadata=tuple(CALLER.items()))
                    samples[name].append(time.perf_counter() - started)
    finally:
        await with_telemetry.stop(0)
        await plain.stop(0)
    return samples


def hop_cost_us(hops: int) -> float:
    started = time.perf_counter()
    for _ in range(hops):
        with continued_from(CALLER, "bench"):
            pass
    return (time.perf_counter() - started) / hops * 1e6


async def scrape_ms(times: int) -> float:
    endpoint = await serve_metrics("127.0.0.1", 0)
    try:

        def scrape_all() -> float:
            started = time.perf_counter()
            for _ in range(times):
                with urllib.request.urlopen(endpoint.url, timeout=10) as answer:
                    answer.read()
            return (time.perf_counter() - started) / times * 1e3

        return await asyncio.to_thread(scrape_all)
    finally:
        await endpoint.close()


def percentile_ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e3


async def run(calls: int) -> dict[str, float]:
    samples = await call_latencies(calls)
    telemetry_p50 = statistics.median(samples["telemetry"]) * 1e3
    plain_p50 = statistics.median(samples["plain"]) * 1e3
    return {
        "rpc_p50_ms_with_telemetry": round(telemetry_p50, 4),
        "rpc_p50_ms_without": round(plain_p50, 4),
        "rpc_p99_ms_with_telemetry": round(percentile_ms(samples["telemetry"], 0.99), 4),
        "rpc_p99_ms_without": round(percentile_ms(samples["plain"], 0.99), 4),
        "interceptor_cost_us_per_call": round((telemetry_p50 - plain_p50) * 1e3, 1),
        "trace_hop_us": round(hop_cost_us(20_000), 2),
        "scrape_ms": round(await scrape_ms(50), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per server")
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    args = parser.parse_args()
    result = asyncio.run(run(args.calls))
    if not args.json:
        for key, value in result.items():
            print(f"{key:32} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
