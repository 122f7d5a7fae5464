"""`gyre demo` / `gyre down` on the embedded servers: the whole loop runs, then everything stops."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gyre.devstack.processes import pid_running
from gyre_app.stack import DEFAULT_CELLS, load_state, processes, sandboxes_dir

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def state_root() -> Iterator[Path]:
    """A folder of our own right under /tmp rather than in pytest's: pytest locks its temp root
    (0700) whenever any pytest session starts on this machine, which would shut the embedded
    PostgreSQL's own account out of its data folder mid-run."""
    root = Path(tempfile.mkdtemp(prefix="gyre-e2e-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.slow
def test_the_demo_closes_the_loop_on_the_embedded_stack_and_cleans_up(state_root: Path) -> None:
    tmp_path = state_root
    env = {k: v for k, v in os.environ.items() if not k.startswith("GYRE_")}
    env["GYRE_STATE_DIR"] = str(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", "demo", "--keep"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO_ROOT,
    )
    state = load_state(tmp_path / "state")
    try:
        out = done.stdout
        assert done.returncode == 0, out + done.stderr
        assert "on embedded servers" in out
        assert state is not None and [s.name for s in state.services] == [
            n for n, _ in processes(DEFAULT_CELLS)
        ]
        assert state.mode == "gyre"
        assert state.proxy_http_url.startswith("http://127.0.0.1:") and state.proxy_http_url in out
        assert all(pid_running(s.pid) for s in state.services)
        # The loop of DESIGN section 3, stage by stage, for the first group.
        stages = [
            r"runner +ExecutionStarted",
            r"proxy +LlmCallRecorded .* policy v0 on engine-cell-\d",  # served by a satellite
            r"evaluator +RewardAssigned .* reward \d\.\d\d = fail_to_pass",
            r"trajectory +GroupReady +task",
            r"trainer +StepCompleted +v1: 1 group\(s\), [1-9]\d* samples",
            r"trainer +WeightsPublished +v1",
            r"engine +EngineWeightsUpdated +engine-cell-\d: v0 -> v1",
            r"GetExecutionTree +…\w+: [1-9]\d* calls, [1-9]\d* trajectories",
            r"proxy +LlmCallRecorded .* policy v1 on engine-cell-\d",  # the next group: new version
            r"engine now at policy v1",
        ]
        for stage in stages:
            assert re.search(stage, out), f"{stage!r} not in\n{out}"
        assert len(re.findall(r"runner +ExecutionStarted", out)) >= 2
        assert "INVALID_ARGUMENT: tasks[0].family" in out
    finally:
        stop = subprocess.run(
            [sys.executable, "-m", "gyre_app.cli", "down"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=REPO_ROOT,
        )
    assert stop.returncode == 0, stop.stderr
    names = [n for n, _ in reversed(processes(DEFAULT_CELLS))]
    assert stop.stdout.strip() == f"stopped: {', '.join([*names, 'nats', 'postgres'])}"
    assert state is not None and not any(pid_running(s.pid) for s in state.services)
    assert load_state(tmp_path / "state") is None
    assert not sandboxes_dir(tmp_path / "state").exists()
    # No sandboxed harness outlives the stack: every process of ours is gone with its service.
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == "", leftovers.stdout
