"""The scheduling modes `gyre sim` compares: a policy, the initial roles, and the core rule (pure).

| mode | policy | cells at start |
|---|---|---|
| colocate | `colocate`: all cells alternate, training waits for the slowest rollout | all rollout |
| async | `fixed_split` vanilla one-step-off, the workload's `async_rollout_cells` | split |
| async_best | the same with the best split of a sweep over rollout cells | split |
| async_streaming | `fixed_split` streaming, the workload's split | split |
| gyre | `elastic`: core cell trains, elastic satellites, streaming, migration | core trains |
| burst | `burst`: elastic, one update per burst of B groups (no streaming) | core trains |

Ablation variants (the paper's 12-step ablation): `async` (vanilla), `async_streaming`,
`colocate_standalone` (A standalone rollout cells plus a colocated pool, migration, no streaming),
`elastic_no_streaming`, and `gyre` (the full design).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

from services.scheduler.policy import colocate, elastic, fixed_split
from services.scheduler.policy.burst import BURST
from services.scheduler.policy.elastic import ElasticKnobs
from services.scheduler.sim.engine import Policy, Result, Simulation, policy_config
from services.scheduler.sim.workload import Executions, Workload

MODES = ("colocate", "async", "async_best", "async_streaming", "gyre", "burst")
ABLATION = ("async", "async_streaming", "colocate_standalone", "elastic_no_streaming", "gyre")


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    policy: Policy
    initial_training: int
    core_cell: bool


def setup(name: str, w: Workload, *, rollout_cells: int | None = None) -> Setup:
    config = policy_config(w)
    split = w.cells - (rollout_cells if rollout_cells is not None else w.async_rollout_cells)

    def elastic_mode(knobs: ElasticKnobs) -> Setup:
        return Setup(
            policy=partial(elastic.decide, config=config, knobs=knobs),
            initial_training=1 if knobs.core_cell else 0,
            core_cell=knobs.core_cell,
        )

    builders: dict[str, Callable[[], Setup]] = {
        "colocate": lambda: Setup(
            policy=partial(colocate.decide, config=config), initial_training=0, core_cell=False
        ),
        "async": lambda: Setup(
            policy=partial(fixed_split.decide, config=config, streaming=False, batch_sync=True),
            initial_training=split,
            core_cell=True,
        ),
        "async_streaming": lambda: Setup(
            policy=partial(fixed_split.decide, config=config, streaming=True, batch_sync=False),
            initial_training=split,
            core_cell=True,
        ),
        "gyre": lambda: elastic_mode(elastic.GYRE),
        "burst": lambda: elastic_mode(BURST),
        "elastic_no_streaming": lambda: elastic_mode(ElasticKnobs(streaming=False)),
        "colocate_standalone": lambda: elastic_mode(
            ElasticKnobs(streaming=False, core_cell=False, standalone_rollout_cells=w.async_rollout_cells)
        ),
    }
    if name not in builders:
        raise KeyError(name)
    return builders[name]()


def simulate(
    name: str, w: Workload, x: Executions, *, rollout_cells: int | None = None, trace: bool = False
) -> Result:
    s = setup(name, w, rollout_cells=rollout_cells)
    sim = Simulation(w, x, s.policy, initial_training=s.initial_training, core_cell=s.core_cell, trace=trace)
    return sim.run()


def sweep_splits(cells: int, *, most: int = 24) -> Sequence[int]:
    """Rollout-pool sizes to try for async_best: all of 1..cells-1, or `most` spread evenly."""
    if cells - 1 <= most:
        return range(1, cells)
    step = (cells - 2) / (most - 1)
    return sorted({1 + round(i * step) for i in range(most)})


def best_async(w: Workload, x: Executions) -> tuple[int, Result]:
    """The fixed split with the shortest wall time (vanilla one-step-off Async)."""
    feasible = [a for a in sweep_splits(w.cells) if a * w.executions_per_cell >= w.group_size]
    runs = [(a, simulate("async", w, x, rollout_cells=a)) for a in feasible]
    return min(runs, key=lambda run: (run[1].wall_s, run[0]))
