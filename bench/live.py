"""Benchmark of the scheduling modes live: one short workload on the same CPU cells in each mode,
each run then simulated by `gyre sim` from its own measurements (shell).

    python -m bench.live --json [--steps 6] [--modes gyre,colocate,async,burst]

Each mode gets a fresh stack (`bench.cell_rig` with a loop: scheduler, proxy, trajectory service,
trainer with steps from the scheduler, a core and two satellites with torch engines and warm
training workers). The workload is scripted executions with a spread of lengths, so the tail
matters: this benchmark plays the runner and the evaluator (it takes `ExecutionScheduled`, makes
the execution's one greedy model call of its length through the proxy, and publishes
`ExecutionStarted`, `ExecutionFinished` and `RewardAssigned`); everything else is the real
services. Steps * B tasks of G executions are submitted at once and the run ends at the last
`StepCompleted`.

Per mode: `wall_s`; `busy_share`, `idle_share`, `switching_share` of cell-time (sampled from the
services, `bench.live_measure`); `num_switches`; staleness mean and max and
`num_samples_dropped_stale`; the costs it measured (`costs`); and `sim_wall_s`, what `gyre sim`
gives for a workload built from that run (its executions' measured lengths and output tokens in
admission order, its measured training rate, step overhead, switch and drain times), with
`sim_rel_err` = |sim - live| / live. Then `gyre_fastest` and `max_sim_rel_err`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import openai

from bench.cell_rig import LiveCells, Loop, live_cells
from bench.live_measure import RunRecord, Sampler, measured_costs, simulate_run
from bench.slice import servers
from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer, ConsumerSpec
from gyre.devstack.scratch import scratch_kernel
from gyre.evaluator.v1 import evaluator_pb2
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import DecodedEvent, new_event
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.demo import EventTap
from services.trainer.config import TrainerSettings

LENGTHS = (24, 48, 96, 200)
"""Output tokens of the executions, in turn: a spread with a long tail."""
GROUP_SIZE = 2
SLOTS = 2
MESSAGES = [{"role": "user", "content": "Fix the failing test and run the test suite again."}]


class ScriptedRunner:
    """Plays the runner and the evaluator for scheduled executions (the rest is real)."""

    def __init__(self, live: LiveCells, bus: Bus, record: RunRecord, order: dict[str, int]) -> None:
        self.live = live
        self.bus = bus
        self.record = record
        self.order = order
        """Task id -> its index in submission order."""
        self.count = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable="bench-live-runner",
            producer="scheduler",
            handlers={scheduler_events.ExecutionScheduled: self.on_scheduled},
        )

    async def on_scheduled(self, event: DecodedEvent) -> None:
        length = LENGTHS[self.count % len(LENGTHS)]
        score = float(self.count % 2)
        self.count += 1
        task = asyncio.create_task(
            self.run(
                event.payload.execution,
                length=length,
                score=score,
                admitted_version=event.payload.admitted_version.steps,
            )
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def publish(self, payload: object, producer: str, correlation_id: str) -> None:
        await self.bus.publish(new_event(payload, producer=producer, correlation_id=correlation_id))  # type: ignore[arg-type]

    async def run(self, ref: object, *, length: int, score: float, admitted_version: int) -> None:
        task_id, execution_id = ref.task_id, ref.execution_id  # type: ignore[attr-defined]
        started = time.monotonic()
        await self.publish(runner_events.ExecutionStarted(execution=ref), "runner", task_id)  # type: ignore[arg-type]
        token = await self.live.register_execution(
            execution_id=execution_id, task_id=task_id, admitted_version=admitted_version
        )
        client = openai.AsyncOpenAI(base_url=f"{self.live.http_url}/v1", api_key=token, max_retries=0)
        stream: Any = await client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,  # type: ignore[arg-type]
            stream=True,
            temperature=0,
            max_tokens=length,
        )
        chunks = 0
        async for chunk in stream:
            chunks += sum(1 for c in chunk.choices if c.delta.content)
        duration = time.monotonic() - started
        self.record.executions[(self.order[task_id], ref.index_in_group)] = (duration, chunks)  # type: ignore[attr-defined]
        await self.publish(
            runner_events.ExecutionFinished(execution=ref, duration_s=duration),  # type: ignore[arg-type]
            "runner",
            task_id,
        )
        grade = evaluator_pb2.Grade(execution_id=execution_id, task_id=task_id, score=score, assessable=True)
        await self.publish(evaluator_events.RewardAssigned(grade=grade), "evaluator", task_id)


async def run_mode(
    kernel: KernelSettings, model: Path, state: Path, *, mode: str, steps: int
) -> dict[str, object]:
    loop = Loop(mode=mode, groups_per_step=1, max_staleness=1)
    async with live_cells(kernel, model, state, slots=SLOTS, loop=loop) as live:
        assert kernel.nats_url is not None
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix), name="bench-live")
        tap = EventTap(bus, (trainer_events.StepCompleted, scheduler_events.CellRoleChanged))
        await tap.start()
        record = RunRecord(
            cells=len(live.satellites) + 1,
            slots=SLOTS,
            group_size=GROUP_SIZE,
            groups_per_step=loop.groups_per_step,
            max_staleness=loop.max_staleness,
            microbatch_tokens=TrainerSettings().microbatch_max_tokens,
            weight_bytes=gradient_bytes(model),
        )
        specs = [
            pb.TaskSpec(
                name=f"t{i}",
                family="terminal",
                prompt="p",
                group_size=GROUP_SIZE,
                timeout_s=600,
                harness="scripted",
            )
            for i in range(steps * loop.groups_per_step)
        ]
        order: dict[str, int] = {}
        runner = ScriptedRunner(live, bus, record, order)
        sampler = Sampler(
            scheduler=live.scheduler, proxy=live.proxy, trainer_address=live.trainer_address, slots=SLOTS
        )
        consumer = Consumer(bus, runner.spec())
        stop = asyncio.Event()
        consuming = asyncio.create_task(consumer.run(stop))
        sampling = asyncio.create_task(sampler.run(stop))
        started = time.monotonic()
        answer = await live.scheduler.SubmitTasks(
            pb.SubmitTasksRequest(request_id=f"live-{uuid.uuid4().hex[:8]}", tasks=specs)
        )
        order.update({t.task_id: i for i, t in enumerate(answer.tasks)})
        steps_seen: list[trainer_events.StepCompleted] = []
        deadline = time.monotonic() + 600
        try:
            while len(steps_seen) < steps and time.monotonic() < deadline:
                try:
                    event = await asyncio.wait_for(tap.queue.get(), timeout=deadline - time.monotonic())
                except TimeoutError:
                    break
                if isinstance(event.payload, trainer_events.StepCompleted):
                    p = event.payload
                    steps_seen.append(p)
                    record.steps.append(
                        (p.duration_s, p.num_target_tokens, max(1, p.max_dp_world_size), time.monotonic())
                    )
                elif isinstance(event.payload, scheduler_events.CellRoleChanged):
                    record.switches.append(event.payload.switch)
        finally:
            wall = time.monotonic() - started
            stop.set()
            await consuming
            await sampling
            await bus.close()
    record.step_started = sampler.started
    costs = measured_costs(record)
    sim_wall = simulate_run(mode, record, costs) if len(steps_seen) == steps else float("nan")
    return {
        "wall_s": wall,
        "steps": len(steps_seen),
        **sampler.shares.fractions(),
        "num_switches": len(record.switches),
        "staleness_mean": sum(s.staleness_mean_steps for s in steps_seen) / max(1, len(steps_seen)),
        "staleness_max": max((s.staleness_max_steps for s in steps_seen), default=0),
        "num_samples_dropped_stale": sum(s.num_samples_dropped_stale for s in steps_seen),
        # In admission order (task, index in group): what the simulation replays.
        "execution_s": [round(record.executions[k][0], 2) for k in sorted(record.executions)],
        "costs": asdict(costs),
        "sim_wall_s": sim_wall,
        "sim_rel_err": abs(sim_wall - wall) / wall,
    }


def gradient_bytes(model: Path) -> float:
    """Bytes of the float64 gradients the members all-reduce (the float32 weights, twice)."""
    return 2.0 * sum(f.stat().st_size for f in model.glob("*.safetensors"))


async def main_async(*, steps: int, modes: list[str]) -> dict[str, object]:
    from services.engine.model_init import init_model

    nats_url, database_url = servers()
    result: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="gyre-live-") as tmp:
        model = init_model(Path(tmp) / "model")
        for mode in modes:
            async with scratch_kernel(nats_url, database_url, label="live") as kernel:
                result[mode] = await run_mode(kernel, model, Path(tmp) / mode, mode=mode, steps=steps)
    runs = {m: r for m, r in result.items() if isinstance(r, dict)}
    walls = {m: r["wall_s"] for m, r in runs.items()}
    result["gyre_fastest"] = bool(walls) and min(walls, key=walls.get) == "gyre"  # type: ignore[arg-type]
    result["max_sim_rel_err"] = max((r["sim_rel_err"] for r in runs.values()), default=float("nan"))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--modes", default="gyre,colocate,async,burst")
    ns = parser.parse_args(argv)
    result = asyncio.run(main_async(steps=ns.steps, modes=ns.modes.split(",")))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
