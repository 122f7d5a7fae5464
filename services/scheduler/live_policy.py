"""The decision function of each live mode: `policy.modes.mode_policy`, as `gyre sim` takes it (pure).

Live, the core cell always trains in every mode (it holds the optimizer and has no engine), so
colocate alternates the satellites only and async's fixed rollout pool is every satellite.
"""

from __future__ import annotations

from services.scheduler.cells import Mode
from services.scheduler.policy.modes import Policy, mode_policy
from services.scheduler.policy.state import PolicyConfig

__all__ = ["Policy", "policy_for"]


def policy_for(mode: Mode, config: PolicyConfig) -> Policy:
    return mode_policy(mode, config, rollout_cells=config.num_cells - 1).policy
