"""Benchmark of the foundation slice: SubmitTasks latency, event delivery to the trajectory service,
and raw JetStream publish rate, on real NATS and Postgres (shell).

    python -m bench.slice --json

Uses GYRE_NATS_URL / GYRE_DATABASE_URL when set, else the embedded servers. Runs in a fresh
database and bus prefix of its own and removes both afterwards. Prints one JSON object last.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

import grpc

from gyre.bus import Bus, BusConfig
from gyre.devstack.scratch import scratch_kernel
from gyre.events import new_event
from gyre.scheduler.v1 import events_pb2, scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build as build_scheduler
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory


def servers() -> tuple[str, str]:
    nats_url, db_url = os.environ.get("GYRE_NATS_URL"), os.environ.get("GYRE_DATABASE_URL")
    if nats_url and db_url:
        return nats_url, db_url
    from gyre.devstack.embedded import start_nats, start_postgres

    state = Path(".gyre") / "bench-servers"
    return nats_url or start_nats(state / "nats").url, db_url or start_postgres(state / "postgres").url


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spec(group_size: int) -> scheduler_pb2.TaskSpec:
    return scheduler_pb2.TaskSpec(
        name="bench", family="terminal", prompt="p", group_size=group_size, timeout_s=60, harness="gyre-agent"
    )


async def measure(
    kernel: KernelSettings, *, requests: int, group_size: int, publishes: int
) -> dict[str, float]:
    hosts = [
        await build_scheduler(SchedulerSettings(port=0, admission="at_submit"), kernel),
        await build_trajectory(TrajectorySettings(port=0), kernel),
    ]
    for h in hosts:
        await h.start()
    sch_channel = grpc.aio.insecure_channel(hosts[0].address)
    trj_channel = grpc.aio.insecure_channel(hosts[1].address)
    scheduler = scheduler_pb2_grpc.SchedulerServiceStub(sch_channel)
    trajectory = trajectory_pb2_grpc.TrajectoryServiceStub(trj_channel)
    submit_ms, delivered_ms = [], []
    try:
        for i in range(requests):
            t0 = time.perf_counter()
            answer = await scheduler.SubmitTasks(
                scheduler_pb2.SubmitTasksRequest(request_id=f"bench-{i}", tasks=[spec(group_size)])
            )
            t1 = time.perf_counter()
            for _ in range(2000):  # bounded: 10 s
                try:
                    await trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=answer.tasks[0].task_id))
                    break
                except grpc.aio.AioRpcError:
                    await asyncio.sleep(0.005)
            submit_ms.append((t1 - t0) * 1000)
            delivered_ms.append((time.perf_counter() - t1) * 1000)

        concurrent, per_call = 8, 10
        t0 = time.perf_counter()
        await asyncio.gather(
            *(
                scheduler.SubmitTasks(
                    scheduler_pb2.SubmitTasksRequest(
                        request_id=f"bench-c{c}-{k}", tasks=[spec(group_size)] * per_call
                    )
                )
                for c in range(concurrent)
                for k in range(5)
            )
        )
        tasks_per_s = concurrent * 5 * per_call / (time.perf_counter() - t0)

        assert kernel.nats_url is not None
        # A prefix of its own: no consumer of the slice reads these.
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=f"{kernel.bus_prefix}raw"))
        event = events_pb2.TaskSubmitted(task=scheduler_pb2.Task(task_id="t", spec=spec(group_size)))
        envelopes = [new_event(event, producer="scheduler", correlation_id="t") for _ in range(publishes)]
        t0 = time.perf_counter()
        for env in envelopes:
            await bus.publish(env)
        publish_per_s = publishes / (time.perf_counter() - t0)
        await bus.close()
    finally:
        await sch_channel.close()
        await trj_channel.close()
        for h in hosts:
            await h.stop()
    return {
        "submit_latency_p50_ms": round(statistics.median(submit_ms), 3),
        "submit_latency_p99_ms": round(pct(submit_ms, 0.99), 3),
        "event_to_trajectory_p50_ms": round(statistics.median(delivered_ms), 3),
        "event_to_trajectory_p99_ms": round(pct(delivered_ms, 0.99), 3),
        "submit_tasks_per_s_concurrent": round(tasks_per_s, 1),
        "jetstream_publish_per_s_sequential": round(publish_per_s, 1),
    }


async def run(args: argparse.Namespace) -> dict[str, object]:
    nats_url, admin_url = servers()
    async with scratch_kernel(nats_url, admin_url, label="bench") as kernel:
        figures = await measure(
            kernel, requests=args.requests, group_size=args.group_size, publishes=args.publishes
        )
    return {"benchmark": "slice", "requests": args.requests, "group_size": args.group_size, **figures}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.slice", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--publishes", type=int, default=2000)
    args = parser.parse_args()
    from gyre.logs import configure_logging

    configure_logging(level="warning")
    result = asyncio.run(run(args))
    if not args.json:
        for key, value in result.items():
            print(f"{key:>36}: {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
