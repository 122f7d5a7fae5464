"""`gyre up` / `gyre down` on the embedded servers, end to end: every service starts and stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.devstack.processes import pid_running
from gyre.devstack.stack import SERVICES, load_state

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.e2e
@pytest.mark.slow
def test_the_demo_runs_the_slice_on_the_embedded_stack_and_cleans_up(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-m", "gyre.cli", "demo", "--keep"],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=REPO_ROOT,
    )
    state = load_state(tmp_path / "state")
    try:
        assert done.returncode == 0, done.stdout + done.stderr
        assert "on embedded servers" in done.stdout
        assert "3. trajectory.GetGroup -> group of 4 (repo_generation), ready=False" in done.stdout
        assert "same task" in done.stdout and "(no second batch): True" in done.stdout
        assert "INVALID_ARGUMENT: tasks[0].family" in done.stdout
        assert state is not None and [s.name for s in state.services] == list(SERVICES)
        assert all(pid_running(s.pid) for s in state.services)
    finally:
        stop = subprocess.run(
            [sys.executable, "-m", "gyre.cli", "down"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO_ROOT,
        )
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.strip() == f"stopped: {', '.join([*reversed(SERVICES), 'nats', 'postgres'])}"
    assert state is not None and not any(pid_running(s.pid) for s in state.services)
    assert load_state(tmp_path / "state") is None
