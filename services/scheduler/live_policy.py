"""The decision function of each live mode: the policy modules' own functions, nothing added (pure).

| mode | function | as `gyre sim` runs it |
|---|---|---|
| colocate | `colocate.decide` | colocate |
| async | `fixed_split.decide`, one-step-off (whole-batch steps, no streaming) | async |
| gyre | `elastic.decide` with `GYRE` (elastic satellites, streaming) | gyre |
| burst | `burst.decide` (elastic, one update per burst of B groups) | burst |

The table repeats the policy half of `sim.modes.setup` (which also needs a workload);
`tests/test_live_policy.py` fails when the two drift apart. Live, the core cell always trains in
every mode (it holds the optimizer and has no engine), so colocate alternates the satellites only.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from services.scheduler.cells import Mode
from services.scheduler.policy import burst, colocate, elastic, fixed_split
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig

Policy = Callable[[ClusterView], Decision]


def policy_for(mode: Mode, config: PolicyConfig) -> Policy:
    if mode == "colocate":
        return partial(colocate.decide, config=config)
    if mode == "async":
        return partial(fixed_split.decide, config=config, streaming=False, batch_sync=False)
    if mode == "burst":
        return partial(burst.decide, config=config)
    return partial(elastic.decide, config=config, knobs=elastic.GYRE)
