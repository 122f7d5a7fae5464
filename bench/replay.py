"""Replay speed of the trajectory call log, and whether recorded steps' batches can be re-derived.

    python -m bench.replay [--json] [--calls N] [--steps S]

- events_per_s: recorded calls folded per second when `gyre replay` rebuilds the trajectory
  service's projections (execution headers, trajectories, tree_calls) from a call log of `--calls`
  synthetic calls (default 100,000: seeded agent executions of ~100 calls each, with sub-agents,
  retries and compaction) into a scratch schema: stream the log rows' headers through one
  server-side cursor (no projection depends on a token, so no payload is read or decoded), fold
  each execution's tree shape, COPY the projection rows. Ingesting the log is set-up, not timed. The diff
  against the live projections runs after the timing and is reported as `projections_match`.
- step_checksum_match: a recorded run on the real trajectory service and trainer (in-process,
  real NATS and Postgres, the tiny torch model): `--steps` steps of 2 groups each, whose calls
  were made by older policy versions (stale samples included). For every step, `gyre replay
  step`'s re-derivation (GetStep, StreamSamples again, the staleness rule, the checksum) must give
  the checksum the trainer recorded; the figure is the fraction that do.

Targets: events_per_s >= 50,000; step_checksum_match 1.0. Uses GYRE_NATS_URL / GYRE_DATABASE_URL
(each run makes and drops its own database and bus prefix).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import grpc

from gyre.bus import Bus, BusConfig
from gyre.common.v1 import ids_pb2
from gyre.db.engine import libpq_url, make_engine, make_sessionmaker
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import new_event
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from gyre.trajectory.v1 import trajectory_pb2, trajectory_pb2_grpc
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.migrations import upgrade
from gyre_app.replay_step import replay_step
from services.trainer.config import TrainerSettings
from services.trainer.main import build as build_trainer
from services.trajectory.call_log import CallLog
from services.trajectory.config import TrajectorySettings
from services.trajectory.log_replay import create_scratch, diff_projections, replay_into
from services.trajectory.main import build as build_trajectory
from services.trajectory.synthetic import SyntheticConfig, generate_execution

TARGETS = {"events_per_s": 50_000, "step_checksum_match": 1.0}
SMALL_EXECUTION = {
    "target_tokens": 6_000,
    "system_prompt_tokens": 60,
    "task_tokens": 20,
    "output_tokens_mean": 20.0,
    "observation_tokens_mean": 40.0,
    "compaction_context_tokens": 2_000,
    "summary_tokens": 30,
    "sub_agent_probability": 0.05,
    "calls_per_version": 25,
}
INGEST_BATCH_CALLS = 5_000
GROUPS_PER_STEP = 2


async def replay_speed(kernel: KernelSettings, num_calls: int) -> dict[str, Any]:
    assert kernel.database_url is not None
    url = kernel.database_url
    await asyncio.to_thread(upgrade, "trajectory", url)
    engine = make_engine(url)
    sessions = make_sessionmaker(engine)
    stored, seed, executions, pending = 0, 0, [], []
    t0 = time.perf_counter()
    while stored + len(pending) < num_calls:
        e = str(uuid.uuid4())
        executions.append(e)
        pending += generate_execution(e, config=SyntheticConfig(seed=seed, **SMALL_EXECUTION))  # type: ignore[arg-type]
        seed += 1
        if len(pending) >= INGEST_BATCH_CALLS or stored + len(pending) >= num_calls:
            async with sessions() as session, session.begin():
                result = await CallLog(cache_size=0).ingest(session, pending)
            assert not result.rejected, result.rejected
            stored += result.stored
            pending = []
    ingest_s = time.perf_counter() - t0
    await engine.dispose()
    pg = await asyncpg.connect(libpq_url(url))
    try:
        schema = f"trajectory_replay_{uuid.uuid4().hex[:10]}"
        await create_scratch(pg, schema)
        t0 = time.perf_counter()
        replayed = await replay_into(pg, schema, executions)
        replay_s = time.perf_counter() - t0
        diffs = await diff_projections(pg, schema, executions)
        await pg.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await pg.close()
    return {
        "events": replayed,
        "executions": len(executions),
        "events_per_s": round(replayed / replay_s),
        "replay_s": round(replay_s, 2),
        "ingest_s": round(ingest_s, 1),
        "projections_match": all(d.same for d in diffs),
    }


async def record_group(bus: Bus, trajectory: Any, *, index: int, policy_version: int) -> str:
    """A ready group of two executions (rewards 1 and 0), each two chained calls made by
    `policy_version`, published as the scheduler, the proxy and the evaluator would."""
    task_id = str(uuid.uuid4())
    refs = [
        ids_pb2.ExecutionRef(task_id=task_id, execution_id=str(uuid.uuid4()), index_in_group=i)
        for i in range(2)
    ]
    task = scheduler_pb2.Task(
        task_id=task_id, spec=scheduler_pb2.TaskSpec(family="arith", group_size=2), executions=refs
    )
    await bus.publish(
        new_event(scheduler_events.TaskSubmitted(task=task), producer="scheduler", correlation_id=task_id)
    )
    for k, ref in enumerate(refs):
        prompt = [1, 2, 3 + (index + k) % 40]
        for turn in range(2):
            output = [20 + (index + turn + k) % 60, 30 + turn, 40 + k]
            call = proxy_pb2.CallRecord(
                execution_id=ref.execution_id,
                call_id=str(uuid.uuid4()),
                agent_role=proxy_pb2.AGENT_ROLE_MAIN,
                agent_id="main",
                output_ids=output,
                output_logprobs=[-0.5 - 0.1 * t for t in range(len(output))],
                engine_id="cell-1",
                policy_version=ids_pb2.PolicyVersion(steps=policy_version),
            )
            call.full_prompt.prompt_ids.extend(prompt)
            await bus.publish(
                new_event(proxy_events.LlmCallRecorded(call=call), producer="proxy", correlation_id=task_id)
            )
            prompt = [*prompt, *output, 5 + turn]
    for _ in range(300):  # bounded: the group and its calls reach the trajectory service (60 s)
        try:
            await trajectory.GetGroup(trajectory_pb2.GetGroupRequest(task_id=task_id))
            for ref in refs:
                tree = await trajectory.GetExecutionTree(
                    trajectory_pb2.GetExecutionTreeRequest(execution_id=ref.execution_id)
                )
                if len(tree.tree.calls) < 2:
                    raise LookupError
            break
        except (grpc.aio.AioRpcError, LookupError):
            await asyncio.sleep(0.2)
    for k, ref in enumerate(refs):
        grade = evaluator_pb2.Grade(
            execution_id=ref.execution_id, task_id=task_id, score=1.0 - k, assessable=True
        )
        await bus.publish(
            new_event(
                evaluator_events.RewardAssigned(grade=grade), producer="evaluator", correlation_id=task_id
            )
        )
    return task_id


async def checksum_match(kernel: KernelSettings, num_steps: int, state_dir: Path) -> dict[str, Any]:
    trajectory = await build_trajectory(TrajectorySettings(port=0), kernel)
    await trajectory.start()
    trainer = await build_trainer(
        TrainerSettings(
            port=0,
            state_dir=state_dir,
            trajectory_address=trajectory.address,
            groups_per_step=GROUPS_PER_STEP,
            max_staleness_steps=2,
        ),
        kernel,
    )
    await trainer.start()
    assert kernel.nats_url is not None
    bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix))
    traj_channel = grpc.aio.insecure_channel(trajectory.address)
    trainer_channel = grpc.aio.insecure_channel(trainer.address)
    traj_stub = trajectory_pb2_grpc.TrajectoryServiceStub(traj_channel)
    trainer_stub = trainer_pb2_grpc.TrainerServiceStub(trainer_channel)
    try:
        for step in range(num_steps):
            for g in range(GROUPS_PER_STEP):
                # Generated up to 3 versions back: some samples stale, some past the bound (dropped).
                await record_group(
                    bus, traj_stub, index=2 * step + g, policy_version=max(0, step - (step + g) % 4)
                )
            for _ in range(600):  # bounded: 120 s per step
                status = await trainer_stub.GetStatus(trainer_pb2.GetStatusRequest())
                if status.version.steps > step:
                    break
                await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"step {step + 1} was not trained within 120 s")
        addresses = ServiceAddresses(known={"trajectory": trajectory.address, "trainer": trainer.address})
        async with GyreClient(addresses) as client:
            replays = [await replay_step(client, v) for v in range(1, num_steps + 1)]
    finally:
        await traj_channel.close()
        await trainer_channel.close()
        await bus.close()
        await trainer.stop()
        await trajectory.stop()
    return {
        "steps": num_steps,
        "step_checksum_match": sum(r.matches for r in replays) / len(replays),
        "samples_dropped_stale": sum(len(r.fetched) - len(r.trained) for r in replays),
        "samples_trained": sum(len(r.trained) for r in replays),
    }


async def run(num_calls: int, num_steps: int) -> dict[str, Any]:
    nats_url = os.environ.get("GYRE_NATS_URL", "nats://127.0.0.1:4222")
    admin_url = os.environ.get("GYRE_DATABASE_URL", "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres")
    async with scratch_kernel(nats_url, admin_url, label="bench_replay") as kernel:
        speed = await replay_speed(kernel, num_calls)
    with tempfile.TemporaryDirectory(prefix="gyre-bench-replay-") as tmp:
        async with scratch_kernel(nats_url, admin_url, label="bench_replay_steps") as kernel:
            steps = await checksum_match(kernel, num_steps, Path(tmp))
    return {**speed, **steps, "targets": TARGETS}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.add_argument("--calls", type=int, default=100_000, help="calls in the replayed log")
    parser.add_argument("--steps", type=int, default=6, help="steps of the recorded run")
    ns = parser.parse_args()
    figures = asyncio.run(run(ns.calls, ns.steps))
    if not ns.json:
        for k, v in figures.items():
            print(f"{k}: {v}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
