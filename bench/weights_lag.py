"""Benchmark of bounded staleness per token: what holding a call until its engine has loaded the
execution's admitted version costs, and what it prevents (shell).

    python -m bench.weights_lag --json [--rounds N]

A real torch engine (tiny model, one thread) follows `WeightsPublished` from the bus, behind the
proxy (in this process). Each round sends two identical calls, the race the bound closes: one
of an execution admitted at v (the trainer's version is v, the engine still holds v-1: the proxy
holds the call) and one of an execution admitted at 0 (no bound: what every call was before),
then, once the first waits, publishes v. The engine is polled for the moment it holds v
(`engine_lag_s`, from the publish); the bounded call's answer is timed from the publish too.
From the recorded calls: bounded calls whose oldest token is below v (must be 0), and unbounded
calls generated partly or wholly with the old weights.
Uses GYRE_NATS_URL / GYRE_DATABASE_URL when set, else the embedded servers; a fresh database and
bus prefix, removed afterwards. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from bench.fault_stack import read_events
from bench.slice import servers
from gyre.common.v1 import ids_pb2
from gyre.devstack.scratch import scratch_kernel
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.events import new_event
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events

BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "Fix the failing test and run the test suite again."}],
    "max_tokens": 32,
    "temperature": 0,
}


async def register(proxy: Any, *, min_version: int) -> tuple[str, str]:
    token, execution_id = "gyre-" + secrets.token_hex(24), str(uuid.uuid4())
    request = proxy_pb2.RegisterExecutionTokenRequest(request_id=f"reg-{execution_id}", token=token)
    request.execution.execution_id, request.execution.task_id = execution_id, str(uuid.uuid4())
    request.min_policy_version.steps = min_version
    request.expires_at.FromDatetime(datetime.now(UTC) + timedelta(hours=1))
    await proxy.RegisterExecutionToken(request)
    return token, execution_id


async def call(http: aiohttp.ClientSession, url: str, token: str) -> tuple[float, float]:
    """(sent, answered) perf_counter instants of one non-streamed call."""
    started = time.perf_counter()
    async with http.post(
        f"{url}/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {token}"}
    ) as resp:
        assert resp.status == 200, await resp.text()
        await resp.read()
    return started, time.perf_counter()


async def lag_s(engine: Any, version: int) -> float:
    started = time.perf_counter()
    for _ in range(100_000):  # bounded: 200 s
        stats = await engine.GetEngineStats(engine_pb2.GetEngineStatsRequest())
        if stats.policy_version.steps >= version:
            return time.perf_counter() - started
        await asyncio.sleep(0.002)
    raise RuntimeError(f"the engine never loaded version {version}")


async def measure(kernel: KernelSettings, model_dir: Path, *, rounds: int) -> dict[str, Any]:
    from gyre.bus import Bus, BusConfig
    from services.engine.config import EngineSettings
    from services.engine.main import build as build_engine
    from services.proxy.config import ProxySettings
    from services.proxy.main import build_proxy

    assert kernel.nats_url is not None
    bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
    await bus.publish(  # version 0, as the trainer publishes it at start, so the engine follows from it
        new_event(
            trainer_events.WeightsPublished(
                version=ids_pb2.PolicyVersion(steps=0), source_uri=str(model_dir)
            ),
            producer="trainer",
            correlation_id="bench",
        )
    )
    engine_host = await build_engine(
        EngineSettings(
            model_dir=model_dir, engine_id="lag-engine", cell_id="cell-1", num_threads=1, publish_events=False
        ),
        kernel,
    )
    await engine_host.start()
    proxy = await build_proxy(ProxySettings(model_dir=model_dir, model_name="tiny"), kernel)
    await proxy.host.start()
    channels = [grpc.aio.insecure_channel(a) for a in (proxy.host.address, engine_host.address)]
    stub, engine = (
        proxy_pb2_grpc.ProxyServiceStub(channels[0]),
        engine_pb2_grpc.EngineServiceStub(channels[1]),
    )
    await stub.RegisterEngine(
        proxy_pb2.RegisterEngineRequest(
            request_id="lag-engine", cell_id="cell-1", engine_id="lag-engine", address=engine_host.address
        )
    )
    lags, bounded, unbounded = [], [], []
    admitted: dict[str, int] = {}
    """Bounded executions -> the version they were admitted at (the round's)."""
    free: dict[str, int] = {}
    """Unbounded executions -> the version published in their round."""
    try:
        async with aiohttp.ClientSession() as http:
            warm, _ = await register(stub, min_version=0)
            await call(http, proxy.http_url, warm)
            for v in range(1, rounds + 1):
                (new, new_id), (old, old_id) = (
                    await register(stub, min_version=v),
                    await register(stub, min_version=0),
                )
                admitted[new_id] = v
                free[old_id] = v
                # Both calls first: the bounded one waits at the proxy, the other starts on the
                # old weights; then the trainer's version v reaches the engine.
                calls = [asyncio.ensure_future(call(http, proxy.http_url, t)) for t in (new, old)]
                for _ in range(10_000):  # bounded: 20 s
                    if proxy.calls.router.num_waiting:
                        break
                    await asyncio.sleep(0.002)
                published = trainer_events.WeightsPublished(
                    version=ids_pb2.PolicyVersion(steps=v), source_uri=str(model_dir)
                )
                at = time.perf_counter()
                await bus.publish(new_event(published, producer="trainer", correlation_id="bench"))
                lags.append(await lag_s(engine, v))
                (_, answered), (sent, done) = await asyncio.gather(*calls)
                bounded.append(answered - at)
                unbounded.append(done - sent)
        records = await read_events(kernel.nats_url, kernel.bus_prefix, "proxy", proxy_events.LlmCallRecorded)
    finally:
        for channel in channels:
            await channel.close(None)
        await proxy.host.stop(grace_s=1)
        await engine_host.stop(grace_s=1)
        await bus.close()
    oldest = {r.call.execution_id: r.call.policy_version.steps for r in records}
    return {
        "rounds": rounds,
        "engine_lag_s_median": round(statistics.median(lags), 4),
        "engine_lag_s_max": round(max(lags), 4),
        "bounded_answered_after_publish_s_median": round(statistics.median(bounded), 4),
        "unbounded_call_s_median": round(statistics.median(unbounded), 4),
        "bounded_calls_below_admitted_version": sum(oldest[e] < v for e, v in admitted.items()),
        "unbounded_calls_on_old_weights": sum(oldest[e] < v for e, v in free.items()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.weights_lag")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args()
    nats_url, db_url = servers()

    async def run() -> dict[str, Any]:
        from services.engine.model_init import init_model

        with tempfile.TemporaryDirectory(prefix="gyre-weights-lag-") as tmp:
            model_dir = init_model(Path(tmp) / "model")
            async with scratch_kernel(nats_url, db_url, label="weightslag") as kernel:
                return await measure(kernel, model_dir, rounds=ns.rounds)

    result = asyncio.run(run())
    print(json.dumps(result) if ns.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
