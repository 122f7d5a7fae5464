"""Each scheduling mode's decision function and the roles it starts from: the one place both
drivers, `gyre sim` and the live scheduler, take their policy from (pure).

| mode | decision function | cells at start |
|---|---|---|
| colocate | `colocate.decide`: all cells alternate, training waits for the slowest rollout | all rollout |
| async | `fixed_split.decide` vanilla: slots refilled continuously, whole-batch steps | split |
| async_streaming | `fixed_split.decide` streaming: groups enter the running step as ready | split |
| burst_fixed | `fixed_split.decide` batch-synchronous: one burst of B groups at a time | split |
| gyre | `elastic.decide` with `GYRE`: core cell trains, elastic satellites, streaming | core trains |
| burst | `elastic.decide` with `BURST`: elastic, one update per burst of B groups | core trains |
| elastic_no_streaming | `elastic.decide` without streaming (the ablation) | core trains |
| colocate_standalone | `colocate.decide` beside `rollout_cells` standalone rollout cells | all rollout |
| colocate_core | `colocate.decide` on the cells but the core, which always trains beside them | core trains |

`colocate_core` is colocate as the live stack runs it: the core cell holds the optimizer and has
no engine, so the pool that alternates is the satellites (`colocate.decide` sees every cell but
the core, as the live driver's view of the satellites does).

`rollout_cells` is the fixed split's rollout pool (the simulator sweeps it; live, every satellite
serves and the core cell trains, so it is the satellites' count).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from services.scheduler.policy import colocate, elastic, fixed_split
from services.scheduler.policy.burst import BURST
from services.scheduler.policy.elastic import ElasticKnobs
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig

Policy = Callable[[ClusterView], Decision]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModePolicy:
    policy: Policy
    initial_training: int
    """Cells in the training role at start (the rest roll out)."""
    core_cell: bool
    """Cell 0 holds the optimizer and always trains."""


def mode_policy(name: str, config: PolicyConfig, *, rollout_cells: int) -> ModePolicy:
    """The mode's policy and starting roles; KeyError for an unknown mode."""
    split = config.num_cells - rollout_cells

    def elastic_mode(knobs: ElasticKnobs) -> ModePolicy:
        return ModePolicy(
            policy=partial(elastic.decide, config=config, knobs=knobs),
            initial_training=1 if knobs.core_cell else 0,
            core_cell=knobs.core_cell,
        )

    def fixed(*, streaming: bool, batch_sync: bool) -> ModePolicy:
        return ModePolicy(
            policy=partial(fixed_split.decide, config=config, streaming=streaming, batch_sync=batch_sync),
            initial_training=split,
            core_cell=True,
        )

    builders: dict[str, Callable[[], ModePolicy]] = {
        "colocate": lambda: ModePolicy(
            policy=partial(colocate.decide, config=config), initial_training=0, core_cell=False
        ),
        "async": lambda: fixed(streaming=False, batch_sync=False),
        "burst_fixed": lambda: fixed(streaming=False, batch_sync=True),
        "async_streaming": lambda: fixed(streaming=True, batch_sync=False),
        "gyre": lambda: elastic_mode(elastic.GYRE),
        "burst": lambda: elastic_mode(BURST),
        "elastic_no_streaming": lambda: elastic_mode(ElasticKnobs(streaming=False)),
        "colocate_standalone": lambda: ModePolicy(
            policy=partial(colocate.decide, config=config, standalone_rollout_cells=rollout_cells),
            initial_training=0,
            core_cell=False,
        ),
    }
    builders["colocate_core"] = lambda: ModePolicy(
        policy=partial(_beside_core, decide=partial(colocate.decide, config=config)),
        initial_training=1,
        core_cell=True,
    )
    if name not in builders:
        raise KeyError(name)
    return builders[name]()


def _beside_core(view: ClusterView, *, decide: Policy) -> Decision:
    """`decide` on a view without the core cell (in training, it never switches)."""
    return decide(dataclasses.replace(view, training_cells=view.training_cells - 1))
