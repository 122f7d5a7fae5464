"""`gyre sim`: the simulator's command, with emulation profiles read here (shell).

The simulator lives in the scheduler service, which imports no application code; the profile
parser lives in the application (`gyre_app.emulation.profile`). This module hands the one to the
other, so `gyre sim --profile P` charges exactly the costs the emulated cells of P spend.
"""

from __future__ import annotations

from collections.abc import Mapping

from gyre_app.emulation.profile import load_profile, workload_costs
from services.scheduler.sim import cli


def _costs(path: str) -> Mapping[str, Mapping[str, float]]:
    return workload_costs(load_profile(path))


def main(argv: list[str]) -> int:
    return cli.main(argv, profile_costs=_costs)
