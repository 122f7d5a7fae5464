"""`gyre restart SERVICE`: one service of a running stack comes back in place, the rest untouched."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gyre.devstack.processes import pid_running, wait_gone
from gyre.settings import KernelSettings
from gyre_app.stack import down, load_state, restart, up


@pytest.mark.e2e
def test_a_killed_service_restarts_on_its_port_and_the_others_keep_running(
    kernel: KernelSettings, tmp_path: Path
) -> None:
    own = KernelSettings(
        nats_url=kernel.nats_url,
        database_url=kernel.database_url,
        bus_prefix=f"{kernel.bus_prefix}r",
        state_dir=tmp_path / "stack",
    )
    state = up(own, services=("scheduler", "trajectory"))
    try:
        scheduler, trajectory = state.services
        os.kill(scheduler.pid, signal.SIGKILL)  # died, as after an out-of-memory kill
        assert wait_gone(scheduler.pid, 10)
        again = restart(own, "scheduler")  # serving when it returns
        assert (again.address, again.pid != scheduler.pid) == (scheduler.address, True)
        assert pid_running(trajectory.pid)  # the rest of the stack was not touched
        recorded = load_state(own.state_dir.resolve())
        assert recorded is not None and [s.pid for s in recorded.services] == [again.pid, trajectory.pid]
        with pytest.raises(RuntimeError, match="runs no 'trainer'"):
            restart(own, "trainer")
    finally:
        down(own)
