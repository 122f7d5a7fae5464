"""Benchmark of the scheduling modes live: one short workload on the same CPU cells in each mode,
the modes interleaved over rounds, each run then simulated by `gyre sim` from its own trace (shell).

    python -m bench.live --json [--steps 6] [--modes gyre,colocate,async,burst] [--rounds 2]
        [--workload short|tools] [--out DIR]

Each run gets a fresh stack (`bench.cell_rig` with a loop: scheduler, proxy, trajectory service,
trainer with steps from the scheduler, a core and two satellites with torch engines and warm
training workers). The workload is `bench.live_agent`'s scripted coding agent (a few model calls
per execution with harness time between them, a spread of lengths), which plays the runner and
the evaluator (`--workload`: `short`, the default, or `tools`, tool time dominant and heavier
steps); everything else is the real services. Steps * B tasks of G executions are
submitted at once and a run ends at the last `StepCompleted`.

The machine's load drifts over minutes (other processes share its cores), so the modes run
interleaved: round 1 in the given order, round 2 reversed, and so on; each mode's figures are
medians over its rounds, and every round is reported with the load average during it.

Per run: `wall_s`; `busy_share`, `idle_share`, `switching_share` of cell-time (sampled from the
services, `bench.live_measure`); `num_switches`; staleness mean and max and
`num_samples_dropped_stale`; the costs it measured (`costs`); and `sim_wall_s`: the run is
exported with `gyre trace export`'s code (its executions' measured lengths and tokens from the
scheduler and the trajectory service, the measured costs as the command's options; the
equivalent command is `trace_command`) and the written workload simulated in the mode's
simulated counterpart, with `sim_rel_err` = |sim - live| / live. Per mode: medians of those.
Then `gyre_fastest` (by median wall time), `gyre_fastest_rounds` and `max_sim_rel_err` (the
largest of the modes' median errors; `max_sim_rel_err_any_run` is the largest single run's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from bench.cell_rig import Loop, live_cells
from bench.live_agent import WORKLOADS, ScriptedAgent, Workload
from bench.live_measure import (
    RunRecord,
    Sampler,
    assumed,
    export_command,
    measured_costs,
    samples_fetch_s,
    simulate_export,
)
from bench.slice import servers
from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer
from gyre.devstack.scratch import scratch_kernel
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.cli_trace import collect, write
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.demo import EventTap

GROUP_SIZE = 2
SLOTS = 2
RUN_TIMEOUT_S = 600


async def run_mode(
    kernel: KernelSettings,
    model: Path,
    state: Path,
    out: Path,
    *,
    mode: str,
    steps: int,
    name: str,
    workload: Workload,
) -> dict[str, object]:
    loop = Loop(mode=mode, groups_per_step=workload.groups_per_step, max_staleness=1)
    load_before = os.getloadavg()[0]
    async with live_cells(kernel, model, state, slots=SLOTS, loop=loop, engine_processes=True) as live:
        assert kernel.nats_url is not None
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix), name="bench-live")
        tap = EventTap(bus, (trainer_events.StepCompleted, scheduler_events.CellRoleChanged))
        await tap.start()
        record = RunRecord(
            cells=len(live.satellites) + 1,
            slots=SLOTS,
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
        agent = ScriptedAgent(live, bus, workload.shapes)
        sampler = Sampler(
            scheduler=live.scheduler, proxy=live.proxy, trainer_address=live.trainer_address, slots=SLOTS
        )
        consumer = Consumer(bus, agent.spec())
        stop = asyncio.Event()
        consuming = asyncio.create_task(consumer.run(stop))
        sampling = asyncio.create_task(sampler.run(stop))
        started = time.monotonic()
        await live.scheduler.SubmitTasks(
            pb.SubmitTasksRequest(request_id=f"live-{uuid.uuid4().hex[:8]}", tasks=specs)
        )
        steps_seen: list[trainer_events.StepCompleted] = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            while len(steps_seen) < steps and time.monotonic() < deadline:
                try:
                    event = await asyncio.wait_for(tap.queue.get(), timeout=deadline - time.monotonic())
                except TimeoutError:
                    break
                if isinstance(event.payload, trainer_events.StepCompleted):
                    p = event.payload
                    steps_seen.append(p)
                    record.steps.append((p.duration_s, max(1, p.max_dp_world_size), time.monotonic()))
                elif isinstance(event.payload, scheduler_events.CellRoleChanged):
                    record.switches.append(event.payload.switch)
        finally:
            wall = time.monotonic() - started
            stop.set()
            await consuming
            await sampling
            await bus.close()
        load_after = os.getloadavg()[0]
        # The run as `gyre trace export` sees it, read while its services still serve.
        addresses = ServiceAddresses(
            known={
                "scheduler": live.scheduler_address,
                "trajectory": live.trajectory_address,
                "trainer": live.trainer_address,
            }
        )
        async with GyreClient(addresses) as client:
            collected = await collect(client, [])
            fetch_s = await samples_fetch_s(client, len(steps_seen))
    record.step_started = sampler.started
    trained = sum(t.tokens for t in collected.traces)
    costs = measured_costs(record, trained_tokens=trained, fetch_s=fetch_s)
    options = assumed(record, costs)
    complete = len(steps_seen) == steps
    sim_wall = (
        simulate_export(mode, Path(write(out, name, collected, options)["workload"]))
        if complete
        else float("nan")
    )
    return {
        "wall_s": wall,
        "steps": len(steps_seen),
        **sampler.shares.fractions(),
        "num_switches": len(record.switches),
        "staleness_mean": sum(s.staleness_mean_steps for s in steps_seen) / max(1, len(steps_seen)),
        "staleness_max": max((s.staleness_max_steps for s in steps_seen), default=0),
        "num_samples_dropped_stale": sum(s.num_samples_dropped_stale for s in steps_seen),
        # In admission order: what the simulation replays.
        "execution_s": [round(t.duration_s, 2) for t in collected.traces],
        "costs": asdict(costs),
        "sim_wall_s": sim_wall,
        "sim_rel_err": abs(sim_wall - wall) / wall,
        "load_avg": [round(load_before, 2), round(load_after, 2)],
        "trace_command": export_command(out, name, options),
    }


def gradient_bytes(model: Path) -> float:
    """Bytes of the float64 gradients the members all-reduce (the float32 weights, twice)."""
    return 2.0 * sum(f.stat().st_size for f in model.glob("*.safetensors"))


def round_orders(modes: list[str], rounds: int) -> list[list[str]]:
    """The order of the modes in each round: as given, then reversed, alternately, so that each
    mode runs as often early as late in a round and a drift in load reaches all alike.

    Example: [a, b, c], 3 rounds -> [a, b, c], [c, b, a], [a, b, c]
    """
    return [list(modes) if r % 2 == 0 else list(reversed(modes)) for r in range(rounds)]


def summarize(runs: dict[str, list[dict[str, object]]], orders: list[list[str]]) -> dict[str, object]:
    """Per mode the medians over its rounds; per round its walls; the targets' figures."""

    def median(mode: str, key: str) -> float:
        return statistics.median(float(r[key]) for r in runs[mode])  # type: ignore[arg-type]

    result: dict[str, object] = {}
    for mode, mode_runs in runs.items():
        result[mode] = {
            "wall_s": median(mode, "wall_s"),
            "sim_wall_s": median(mode, "sim_wall_s"),
            "sim_rel_err": median(mode, "sim_rel_err"),
            **{k: median(mode, k) for k in ("busy_share", "idle_share", "switching_share", "num_switches")},
            "staleness_max": max(int(r["staleness_max"]) for r in mode_runs),  # type: ignore[call-overload]
            "runs": mode_runs,
        }
    walls = {m: median(m, "wall_s") for m in runs}
    rounds: list[dict[str, object]] = []
    for i, order in enumerate(orders):
        wall = {m: float(runs[m][i]["wall_s"]) for m in order}  # type: ignore[arg-type]
        loads = [load for m in order for load in runs[m][i]["load_avg"]]  # type: ignore[attr-defined]
        fastest = min(wall, key=wall.__getitem__)
        rounds.append(
            {"order": order, "wall_s": wall, "fastest": fastest, "load_avg": [min(loads), max(loads)]}
        )
    result["rounds"] = rounds
    result["gyre_fastest"] = bool(walls) and min(walls, key=walls.__getitem__) == "gyre"
    result["gyre_fastest_rounds"] = sum(1 for r in rounds if r["fastest"] == "gyre")
    result["max_sim_rel_err"] = max(median(m, "sim_rel_err") for m in runs)
    result["max_sim_rel_err_any_run"] = max(float(r["sim_rel_err"]) for rs in runs.values() for r in rs)  # type: ignore[arg-type]
    return result


async def main_async(
    *, steps: int, modes: list[str], rounds: int, out: Path | None, workload: str = "short"
) -> dict[str, object]:
    from services.engine.model_init import init_model

    nats_url, database_url = servers()
    orders = round_orders(modes, rounds)
    runs: dict[str, list[dict[str, object]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="gyre-live-") as tmp:
        model = init_model(Path(tmp) / "model")
        traces = out or Path(tmp) / "traces"
        for i, order in enumerate(orders, start=1):
            for mode in order:
                async with scratch_kernel(nats_url, database_url, label="live") as kernel:
                    runs[mode].append(
                        await run_mode(
                            kernel,
                            model,
                            Path(tmp) / f"{mode}-{i}",
                            traces,
                            mode=mode,
                            steps=steps,
                            name=f"live-{mode}-{i}",
                            workload=WORKLOADS[workload],
                        )
                    )
                if out is not None:  # each run as it ends: a long benchmark cut short keeps them
                    (out / f"live-{mode}-{i}.result.json").write_text(json.dumps(runs[mode][-1]))
    return {"workload": workload, **summarize(runs, orders)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.live", description=__doc__)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--modes", default="gyre,colocate,async,burst")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="short")
    parser.add_argument(
        "--out", type=Path, default=None, help="keep each run's exported trace and workload here"
    )
    ns = parser.parse_args(argv)
    if ns.steps < 1 or ns.rounds < 1:
        parser.error("--steps and --rounds must be at least 1")
    modes = ns.modes.split(",")
    unknown = [m for m in modes if m not in ("gyre", "colocate", "async", "burst")]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; known: gyre, colocate, async, burst")
    result = asyncio.run(
        main_async(steps=ns.steps, modes=modes, rounds=ns.rounds, out=ns.out, workload=ns.workload)
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
