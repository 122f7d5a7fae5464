"""What `bench.live` measures while a mode runs: cell-time shares by sampling the live services,
and the costs the run's `gyre trace export` passes to `gyre sim` (shell).

Cell-time shares use the simulator's accounting (`sim.result.Result.shares`), sampled every
`SAMPLE_S` from the live services themselves: a cell the scheduler shows `switching` is switching;
a rollout cell is busy for the share of its slots holding calls (the proxy's in-flight calls: a
half-full cell is half idle, and so is a slot whose execution's harness is running a tool); a
training cell is busy while the trainer has a step in progress and the cell is one of its
data-parallel members, idle otherwise (a satellite waiting for work).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import grpc

from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.trainer.v1 import trainer_pb2, trainer_pb2_grpc
from gyre_app.client import GyreClient
from gyre_app.trace_export import Assumed

SAMPLE_S = 0.1


@dataclass(slots=True)
class Shares:
    """Cell-seconds per state, summed over cells."""

    busy: float = 0.0
    idle: float = 0.0
    switching: float = 0.0
    rollout_busy: float = 0.0
    training_busy: float = 0.0

    def fractions(self) -> dict[str, float]:
        total = self.busy + self.idle + self.switching
        if total <= 0:
            return {"busy_share": 0.0, "idle_share": 0.0, "switching_share": 0.0}
        return {
            "busy_share": self.busy / total,
            "idle_share": self.idle / total,
            "switching_share": self.switching / total,
            "rollout_busy_share": self.rollout_busy / total,
            "training_busy_share": self.training_busy / total,
        }


@dataclass(slots=True)
class Sampler:
    """Polls GetCells, GetRouting and the trainer's GetStatus; accumulates `Shares`."""

    scheduler: scheduler_pb2_grpc.SchedulerServiceAsyncStub
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub
    trainer_address: str
    slots: int
    started: dict[int, float] = field(default_factory=dict)
    """Target version -> monotonic time the trainer started that step (its GetStatus says)."""
    shares: Shares = field(default_factory=Shares)
    samples: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        async with grpc.aio.insecure_channel(self.trainer_address) as channel:
            trainer = trainer_pb2_grpc.TrainerServiceStub(channel)
            last = time.monotonic()
            while not stop.is_set():
                try:
                    cells, routing, status = await asyncio.gather(
                        self.scheduler.GetCells(pb.GetCellsRequest(), timeout=5),
                        self.proxy.GetRouting(proxy_pb2.GetRoutingRequest(), timeout=5),
                        trainer.GetStatus(trainer_pb2.GetStatusRequest(), timeout=5),  # type: ignore[misc]
                    )
                except grpc.aio.AioRpcError:
                    cells = None
                now = time.monotonic()
                if cells is not None:
                    self._add(cells, routing, status, dt=now - last)
                last = now
                try:
                    await asyncio.wait_for(stop.wait(), timeout=SAMPLE_S)
                except TimeoutError:
                    pass

    def _add(
        self,
        cells: pb.GetCellsResponse,
        routing: proxy_pb2.GetRoutingResponse,
        status: trainer_pb2.GetStatusResponse,
        *,
        dt: float,
    ) -> None:
        self.samples += 1
        in_flight: dict[str, int] = {}
        for route in routing.routes:
            if route.state == proxy_pb2.ROUTE_STATE_ACTIVE:
                in_flight[route.cell_id] = in_flight.get(route.cell_id, 0) + route.num_in_flight_calls
        stepping = status.HasField("step")
        if stepping:
            ago = time.time() - status.step.started_at.ToMicroseconds() / 1e6
            self.started.setdefault(status.step.target_version.steps, time.monotonic() - ago)
        members = {m.cell_id for m in status.members}
        s = self.shares
        for cell in cells.cells:
            if cell.role == pb.CELL_ROLE_SWITCHING:
                s.switching += dt
            elif cell.role == pb.CELL_ROLE_ROLLOUT:
                busy = min(1.0, in_flight.get(cell.cell_id, 0) / self.slots) * dt
                s.busy += busy
                s.rollout_busy += busy
                s.idle += dt - busy
            elif cell.role == pb.CELL_ROLE_TRAINING and stepping and cell.cell_id in members:
                s.busy += dt
                s.training_busy += dt
            else:
                s.idle += dt


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """Costs measured on the live run, in the simulator's terms."""

    tokens_per_s_per_cell: float
    step_overhead_s: float
    rollout_to_training_s: float
    training_to_rollout_s: float
    migrate_s: float
    group_setup_s: float
    step_start_s: float


def median_or(values: list[float], default: float) -> float:
    return statistics.median(values) if values else default


@dataclass(slots=True, kw_only=True)
class RunRecord:
    """What one live run measured besides its executions (those come from `gyre trace export`)."""

    cells: int
    slots: int
    weight_bytes: float
    steps: list[tuple[float, int, float]] = field(default_factory=list)
    """Per StepCompleted: (duration_s, DP world size, monotonic time seen)."""
    step_started: dict[int, float] = field(default_factory=dict)
    """Target version -> monotonic time the trainer started it (from its GetStatus)."""
    switches: list[pb.CellSwitch] = field(default_factory=list)


SIM_MODE = {"gyre": "gyre", "colocate": "colocate_core", "async": "async", "burst": "burst"}
"""The simulator's mode for each live one (`policy.modes`): live colocate has a core cell."""
LINK_BYTES_PER_S = 1.0e9
"""Assumed: gloo over loopback between processes of this machine."""
GROUP_SETUP_S = 0.05
"""Assumed: forming a gloo group of a few local processes (not measured by any event)."""


def measured_costs(run: RunRecord, *, trained_tokens: int, fetch_s: list[float]) -> Costs:
    """The run's costs in the simulator's terms; `trained_tokens` in the trace's units (the
    selected trajectories' tokens of the executions the steps trained), so that the simulator
    trains the trace's tokens at the rate the run trained them.

    A step's time outside its compute (from the trainer starting it to its `StepCompleted`) is
    split: before the compute the trainer fetches the samples (`fetch_s`, timed by
    `samples_fetch_s`; the simulator's `step_start_s`: cells switching in meanwhile train from the
    first microbatch), after it the checkpoint, the weights and the commit (`step_overhead_s`)."""
    to_training = [s for s in run.switches if s.ok and s.to_role == pb.CELL_ROLE_TRAINING]
    to_rollout = [s for s in run.switches if s.ok and s.to_role == pb.CELL_ROLE_ROLLOUT]
    cell_s = sum(d * w for d, w, _ in run.steps)
    overhead = [
        max(0.0, seen - run.step_started[v] - duration)
        for v, (duration, _, seen) in enumerate(run.steps, start=1)
        if v in run.step_started
    ]
    start = median_or(fetch_s, 0.0)
    return Costs(
        tokens_per_s_per_cell=trained_tokens / cell_s if cell_s > 0 else 1.0,
        step_overhead_s=max(0.0, median_or(overhead, 0.0) - start),
        step_start_s=start,
        # The drain is the simulator's migration (it pauses the moved executions and the cell).
        rollout_to_training_s=median_or([s.total_s - s.drain_s for s in to_training], 0.0),
        training_to_rollout_s=median_or([s.total_s for s in to_rollout], 0.0),
        migrate_s=median_or([s.drain_s for s in to_training if s.num_calls_migrated], 0.0),
        group_setup_s=GROUP_SETUP_S,
    )


def assumed(run: RunRecord, costs: Costs) -> Assumed:
    """The export's options for this run: its cells and the costs it measured."""
    return Assumed(
        cells=run.cells,
        async_rollout_cells=run.cells - 1,  # live, every satellite serves and the core trains
        executions_per_cell=run.slots,
        tokens_per_s_per_cell=costs.tokens_per_s_per_cell,
        step_overhead_s=costs.step_overhead_s,
        rollout_to_training_s=costs.rollout_to_training_s,
        training_to_rollout_s=costs.training_to_rollout_s,
        migrate_s=costs.migrate_s,
        group_setup_s=costs.group_setup_s,
        step_start_s=costs.step_start_s,
        weight_bytes=run.weight_bytes,
        link_bytes_per_s=LINK_BYTES_PER_S,
    )


def export_command(out_dir: Path, name: str, options: Assumed) -> str:
    """The `gyre trace export` command line that writes the same workload by hand."""
    flags = " ".join(
        f"--{k.replace('_', '-')} {v:.6g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
        for k, v in asdict(options).items()
        if v is not None
    )
    return f"gyre trace export {out_dir} --name {name} {flags}"


def simulate_export(mode: str, workload_path: Path) -> float:
    """What `gyre sim` gives for the exported workload in the live mode's simulated counterpart."""
    from services.scheduler.sim.modes import simulate
    from services.scheduler.sim.workload import draw_executions, load_workload

    w = load_workload(workload_path)
    return simulate(SIM_MODE[mode], w, draw_executions(w)).wall_s


async def samples_fetch_s(client: GyreClient, steps: int) -> list[float]:
    """How long the trajectory service takes to serve each trained step's samples, timed again
    after the run with the request the trainer recorded for the step (`Step.samples_request`):
    the part of a step before its first microbatch, which no event reports."""
    took = []
    for version in range(1, steps + 1):
        step = await client.step(version)
        if not step.HasField("samples_request"):
            continue
        started = time.monotonic()
        await client.stream_samples(step.samples_request)
        took.append(time.monotonic() - started)
    return took
