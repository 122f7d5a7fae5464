"""Benchmark of the scheduling modes on an emulated cluster, live beside `gyre sim` (shell;
EMULATION ONLY: the accelerators are timing models and a scripted agent plays the runner and
the evaluator).

    python -m bench.scale --json [--workload FILE] [--cells N] [--time-scale X]
        [--modes colocate,async,burst,gyre] [--profile FILE] [--out DIR]

One workload in the simulator's format (default `bench/scale_workloads/small-16.yaml`) and one
emulation profile (default `bench/profiles/h100-emulated.yaml`). The profile's costs replace the
workload's (as `gyre sim --profile` does) and every modelled duration is divided by X
(`bench.scale_figures.scaled_workload`; the emulated engines and trainer get `time_scale=X`).

Live, per mode, a fresh stack (`bench.cell_rig` with `emulated=`: the real scheduler, proxy,
trajectory service and trainer taking modelled steps; a core and N-1 satellites whose engines
are emulated in this process) runs the workload's steps: its drawn executions, in order, become
the scripted agent's executions (`bench.live_agent`): two short model calls through the proxy
with the execution's scaled duration as the tool time between them. A run ends at the last
`StepCompleted`. Then the scaled workload is simulated (`services.scheduler.sim`, what
`gyre sim` runs; `sim_command` says the equivalent command) and each live mode is compared with
its simulated counterpart. Live async is the fixed split every-satellite-rolls-out (the live
scheduler's only one), and the workload's `async_rollout_cells` is set to N-1 to match;
`async_streaming` has no live mode and is reported from the simulator alone.

Per run also `control_plane` (`bench.control_plane`'s figures over the run: the services run in
this process, so CPU is this process's) and the emulator's health: `loop_lag_p99_ms`, how late a
probe sleeping `tick_s` in the event loop the engines and services share woke (p99), and
`emulator_saturated`: true when that lag reached a whole engine tick in any run (the engines
then deliver tokens in bunches and the services answer late: this machine, not the modelled
cluster, sets the pace). Prints one JSON object on its last line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import yaml

from bench.cell_rig import Emulated, Loop, live_cells
from bench.control_plane import ControlPlane
from bench.live_agent import ScriptedAgent
from bench.scale_figures import LIVE_MODES, compare_modes, quantile, scaled_workload, shapes
from bench.slice import servers
from gyre.bus import Bus, BusConfig
from gyre.consume import Consumer
from gyre.devstack.scratch import scratch_kernel
from gyre.errors import GyreError
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.demo import EventTap

BENCH = Path(__file__).resolve().parent
DEFAULT_WORKLOAD = BENCH / "scale_workloads" / "small-16.yaml"
DEFAULT_PROFILE = BENCH / "profiles" / "h100-emulated.yaml"
OUTPUTS = (16, 16)
"""Output tokens of each execution's two model calls."""
TICK_S = 0.02
"""The emulated engines' decode tick (`EmulatedCells.start`'s default)."""
RUN_TIMEOUT_S = 300.0


async def loop_lag(stop: asyncio.Event, into: list[float], agent: ScriptedAgent, peak: list[int]) -> None:
    """How late each `TICK_S` sleep of this event loop wakes (seconds), until `stop`; meanwhile
    the most executions the agent ran at once (`peak[0]`)."""
    while not stop.is_set():
        started = time.monotonic()
        await asyncio.sleep(TICK_S)
        into.append(time.monotonic() - started - TICK_S)
        peak[0] = max(peak[0], len(agent.tasks))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_mode(
    kernel: KernelSettings,
    model: Path,
    state: Path,
    *,
    mode: str,
    workload: Any,
    durations_s: list[float],
    profile: Path,
    time_scale: float,
    metrics_url: str,
) -> dict[str, Any]:
    loop = Loop(mode=mode, groups_per_step=workload.groups_per_step, max_staleness=workload.max_staleness)
    emulated = Emulated(profile=profile, time_scale=time_scale, reply_tokens=max(OUTPUTS))
    load_before = os.getloadavg()[0]
    async with live_cells(
        kernel,
        model,
        state,
        satellites=workload.cells - 1,
        slots=workload.executions_per_cell,
        loop=loop,
        emulated=emulated,
    ) as live:
        assert kernel.nats_url is not None
        bus = await Bus.connect(BusConfig(url=kernel.nats_url, prefix=kernel.bus_prefix), name="bench-scale")
        tap = EventTap(bus, (trainer_events.StepCompleted,))
        await tap.start()
        agent = ScriptedAgent(live, bus, shapes(durations_s, outputs=OUTPUTS))
        probe = ControlPlane(pids=[os.getpid()], metrics_urls=[metrics_url], database_url=kernel.database_url)
        stop = asyncio.Event()
        lags: list[float] = []
        peak = [0]
        consuming = asyncio.create_task(Consumer(bus, agent.spec()).run(stop))
        lagging = asyncio.create_task(loop_lag(stop, lags, agent, peak))
        specs = [
            pb.TaskSpec(
                name=f"t{i}",
                family="terminal",
                prompt="p",
                group_size=workload.group_size,
                timeout_s=int(workload.timeout_s) + 60,
                harness="scripted",
            )
            for i in range(workload.steps * workload.groups_per_step)
        ]
        await probe.start()
        started = time.monotonic()
        await live.scheduler.SubmitTasks(
            pb.SubmitTasksRequest(request_id=f"scale-{uuid.uuid4().hex[:8]}", tasks=specs)
        )
        steps = 0
        step_end_s: list[float] = []
        try:
            async with asyncio.timeout(RUN_TIMEOUT_S):
                while steps < workload.steps:
                    event = await tap.queue.get()
                    if isinstance(event.payload, trainer_events.StepCompleted):
                        steps += 1
                        step_end_s.append(round(time.monotonic() - started, 2))
        except TimeoutError:
            pass
        finally:
            wall = time.monotonic() - started
            calls = agent.count * len(OUTPUTS)  # every execution started makes its calls
            figures = await probe.stop(calls=calls)
            stop.set()
            await consuming
            await lagging
            await bus.close()
    lag_p99 = quantile(lags, 0.99)
    return {
        "wall_s": round(wall, 2) if steps == workload.steps else None,
        "steps": steps,
        "step_end_s": step_end_s,
        "executions": agent.count,
        "peak_concurrent_executions": peak[0],
        "calls": calls,
        "calls_per_s": round(calls / wall, 1),
        "control_plane": figures,
        "loop_lag_p99_ms": None if lag_p99 is None else round(lag_p99 * 1000, 1),
        "load_avg": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def simulate(path: Path) -> tuple[dict[str, float], dict[str, list[float]], float]:
    """Every mode of the scaled workload at `path` (what `gyre sim PATH --json` runs): its wall
    time, when each step ended, and the seconds the simulation took."""
    from services.scheduler.sim.report import compare, run_modes
    from services.scheduler.sim.workload import draw_executions, load_workload

    started = time.perf_counter()
    w = load_workload(path)
    x = draw_executions(w)
    runs = run_modes(w, x)
    report = compare(w, x, runs)
    ends = {name: [round(t, 2) for t in result.step_end_s] for name, (result, _) in runs.items()}
    walls = {name: m["wall_s"] for name, m in report["modes"].items()}
    return walls, ends, time.perf_counter() - started


async def main_async(
    *,
    workload_path: Path,
    profile: Path,
    cells: int | None,
    time_scale: float,
    modes: list[str],
    out: Path | None = None,
) -> dict[str, Any]:
    from prometheus_client import start_http_server

    from gyre_app.emulation.profile import load_profile, workload_costs
    from services.engine.model_init import init_model
    from services.scheduler.sim.workload import draw_executions, load_workload

    data = yaml.safe_load(workload_path.read_text())  # noqa: ASYNC240 (before anything runs)
    scaled = scaled_workload(
        data, costs=workload_costs(load_profile(profile)), time_scale=time_scale, cells=cells
    )
    nats_url, database_url = servers()
    port = free_port()
    start_http_server(port, addr="127.0.0.1")  # the in-process services' metrics, for the probe
    metrics_url = f"http://127.0.0.1:{port}/metrics"
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gyre-scale-") as tmp:
        scaled_path = (out or Path(tmp)) / f"{scaled['name']}.yaml"
        scaled_path.write_text(yaml.safe_dump(scaled, sort_keys=False))
        w = load_workload(scaled_path)
        durations = list(draw_executions(w).duration_s)
        model = init_model(Path(tmp) / "model")
        for mode in modes:
            async with scratch_kernel(nats_url, database_url, label="scale") as kernel:
                runs[mode] = await run_mode(
                    kernel,
                    model,
                    Path(tmp) / mode,
                    mode=mode,
                    workload=w,
                    durations_s=durations,
                    profile=profile,
                    time_scale=time_scale,
                    metrics_url=metrics_url,
                )
        sim_walls, sim_ends, sim_s = simulate(scaled_path)
    sim = {m: sim_walls[m] for m in (*LIVE_MODES, "async_streaming")}
    comparison = compare_modes({m: runs[m]["wall_s"] for m in modes}, sim)
    for mode, run in runs.items():
        comparison["modes"][mode]["run"] = run
        comparison["modes"][mode]["sim_step_end_s"] = sim_ends.get(mode)
    lags = [r["loop_lag_p99_ms"] for r in runs.values() if r["loop_lag_p99_ms"] is not None]
    return {
        "label": "emulation only: emulated accelerators, a scripted agent as runner and evaluator",
        "workload": str(workload_path),
        "profile": str(profile),
        "time_scale": time_scale,
        "cells": w.cells,
        "executions": w.total_executions,
        "concurrent_executions": max((r["peak_concurrent_executions"] for r in runs.values()), default=0),
        **comparison,
        "async_split": f"{w.cells - 1} rollout cells + the core training (live and simulated)",
        "sim_best_split_walls_s": {m: sim_walls[m] for m in sim_walls if m.endswith("_best")},
        "control_plane": {m: r["control_plane"] for m, r in runs.items()},
        "loop_lag_p99_ms": max(lags, default=None),
        "emulator_saturated": any(lag >= TICK_S * 1000 for lag in lags),
        # The scaled workload, the profile's costs merged (kept only with --out).
        "sim_command": f"gyre sim {scaled_path if out else scaled_path.name} --json",
        "simulated_in_s": round(sim_s, 2),
        "load_avg_1m": os.getloadavg()[0],
        "cpu_count": os.cpu_count(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--workload", type=Path, default=DEFAULT_WORKLOAD)
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--cells", type=int, default=None, help="default: the workload's")
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--modes", default=",".join(LIVE_MODES))
    parser.add_argument("--out", type=Path, default=None, help="keep the scaled workload here (a folder)")
    ns = parser.parse_args(argv)
    modes = ns.modes.split(",")
    unknown = [m for m in modes if m not in LIVE_MODES]
    if unknown:
        parser.error(f"--modes: unknown {', '.join(unknown)}; live modes: {', '.join(LIVE_MODES)}")
    if ns.cells is not None and ns.cells < 2:
        parser.error(f"--cells must be at least 2 (a core and a satellite), got {ns.cells}")
    if not ns.time_scale > 0:
        parser.error(f"--time-scale must be positive, got {ns.time_scale}")
    if ns.out is not None and not ns.out.is_dir():
        parser.error(f"--out: no such folder: {ns.out}")
    for name, path in (("--workload", ns.workload), ("--profile", ns.profile)):
        if not path.is_file():
            parser.error(f"{name}: no such file: {path}")
    try:
        out = asyncio.run(
            main_async(
                workload_path=ns.workload,
                profile=ns.profile,
                cells=ns.cells,
                time_scale=ns.time_scale,
                modes=modes,
                out=ns.out,
            )
        )
    except GyreError as exc:
        print(f"bench.scale: {exc}", file=sys.stderr)
        return 2
    if not ns.json:
        print(json.dumps(out, indent=1))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
