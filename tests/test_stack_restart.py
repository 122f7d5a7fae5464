"""`gyre restart SERVICE`: one service of a running stack comes back in place, the rest untouched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from gyre.devstack.processes import pid_running, wait_gone
from gyre.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from gyre.settings import KernelSettings
from gyre_app.stack import down, load_state, up, wait_serving
from gyre_app.stack_restart import restart
from gyre_app.supervise import supervisor_pid

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def own(kernel: KernelSettings, tmp_path: Path) -> KernelSettings:
    """A stack of this test's own: its state folder and bus prefix, the session's servers."""
    return KernelSettings(
        nats_url=kernel.nats_url,
        database_url=kernel.database_url,
        bus_prefix=f"{kernel.bus_prefix}{uuid.uuid4().hex[:6]}",
        state_dir=tmp_path / "stack",
    )


@pytest.mark.e2e
def test_a_killed_service_restarts_on_its_port_and_the_others_keep_running(own: KernelSettings) -> None:
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


@pytest.mark.e2e
def test_the_supervisor_restarts_a_dead_service_in_place_and_up_revives_only_the_dead(
    own: KernelSettings,
) -> None:
    state = up(own, services=("scheduler", "trajectory"))
    try:
        scheduler, trajectory = state.services
        watcher = supervisor_pid(own.state_dir.resolve())
        assert watcher is not None
        os.kill(trajectory.pid, signal.SIGKILL)
        back = None
        for _ in range(600):  # bounded: 120 s
            recorded = load_state(own.state_dir.resolve())
            assert recorded is not None
            back = recorded.services[1]
            if back.pid != trajectory.pid and pid_running(back.pid):
                break
            time.sleep(0.2)
        assert back is not None and back.pid != trajectory.pid, "the supervisor never restarted it"
        wait_serving(back, time.monotonic() + 120)
        assert back.address == trajectory.address and pid_running(scheduler.pid)

        # Without the supervisor, `gyre up` after a death starts that one again and nothing else.
        os.kill(watcher, signal.SIGKILL)
        assert wait_gone(watcher, 10)
        os.kill(scheduler.pid, signal.SIGKILL)
        assert wait_gone(scheduler.pid, 10)
        again = up(own, services=("scheduler", "trajectory"))
        assert [s.address for s in again.services] == [scheduler.address, trajectory.address]
        assert again.services[0].pid != scheduler.pid and again.services[1].pid == back.pid
        assert supervisor_pid(own.state_dir.resolve()) not in (None, watcher)
    finally:
        down(own)
    assert supervisor_pid(own.state_dir.resolve()) is None


@pytest.mark.e2e
def test_a_restart_from_an_empty_environment_keeps_the_stack_settings(
    own: KernelSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`gyre restart` from another shell (here: nothing but PATH and the state folder) starts the
    service with the settings `gyre up` gave it: the custom task folder and the bus prefix stay."""
    tasks = tmp_path / "tasks"
    (tasks / "own_task").mkdir(parents=True)
    (tasks / "own_task" / "task.toml").write_text('family = "terminal"\n')
    monkeypatch.setenv("GYRE_SCHEDULER_TASKS_DIR", str(tasks))
    state = up(own, services=("scheduler",))
    monkeypatch.delenv("GYRE_SCHEDULER_TASKS_DIR")
    try:
        assert submit_own_task(state.services[0].address) == 1  # the folder up was given
        bare = {"PATH": os.environ["PATH"], "GYRE_STATE_DIR": str(own.state_dir)}
        done = subprocess.run(
            [sys.executable, "-m", "gyre_app.cli", "restart", "scheduler"],
            cwd=REPO, env=bare, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        again = load_state(own.state_dir.resolve())
        assert again is not None and again.services[0].pid != state.services[0].pid
        assert submit_own_task(again.services[0].address) == 1, "the restart lost the task folder"
        assert again.services[0].settings_env["GYRE_BUS_PREFIX"] == own.bus_prefix
    finally:
        down(own)


def submit_own_task(address: str) -> int:
    """Tasks the scheduler at `address` accepts of one `task:own_task` (refused: a folder without it)."""
    with grpc.insecure_channel(address) as channel:
        answer = scheduler_pb2_grpc.SchedulerServiceStub(channel).SubmitTasks(
            scheduler_pb2.SubmitTasksRequest(
                request_id=f"own-{uuid.uuid4().hex[:8]}",
                tasks=[
                    scheduler_pb2.TaskSpec(
                        name="own", family="terminal", prompt="Do it.", group_size=1,
                        timeout_s=60.0, harness="gyre-agent", workspace_template="task:own_task",
                    )
                ],
            ),
            timeout=30,
        )  # fmt: skip
    return len(answer.tasks)
