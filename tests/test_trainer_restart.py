"""Kill the trainer process mid-run and restart it: it continues from the last completed step.

The trainer runs as a real process (`python -m services.trainer`) against real NATS, Postgres
and the trajectory service; it is killed with SIGKILL by its PID right after its first step
commits (the second group's step may be in flight), two more groups become ready while it is
down, and it is started again on the same state.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest
from trainer_stack import connect_bus, events_on_bus, eventually, fresh_kernel, submit_group

from gyre.db.engine import libpq_url
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2
from gyre.trajectory.v1 import events_pb2 as trajectory_events
from services.trainer.checkpoint import checkpoint_folder
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")
NUM_GROUPS = 4


def start_trainer(
    kernel: KernelSettings, state_dir: Path, trajectory_address: str, log: Path
) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "GYRE_NATS_URL": str(kernel.nats_url),
        "GYRE_DATABASE_URL": str(kernel.database_url),
        "GYRE_BUS_PREFIX": kernel.bus_prefix,
        "GYRE_TRAINER_STATE_DIR": str(state_dir),
        "GYRE_TRAINER_TRAJECTORY_ADDRESS": trajectory_address,
        "GYRE_TRAINER_GROUPS_PER_STEP": "1",
        "GYRE_TRAINER_MAX_STALENESS_STEPS": "100",
        "GYRE_TRAINER_PORT": "0",
    }
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "services.trainer"], env=env, stdout=out, stderr=out)


async def committed_steps(conn: asyncpg.Connection) -> list[tuple[int, list[str]]]:
    rows = await conn.fetch("SELECT version, task_ids FROM trainer.steps ORDER BY version")
    return [(r["version"], json.loads(r["task_ids"])) for r in rows]


async def test_killed_trainer_resumes_from_its_last_step_without_retraining_or_skipping_groups(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with fresh_kernel(*server_urls) as kernel:
        trajectory = await build_trajectory(TrajectorySettings(port=0), kernel)
        await trajectory.start()
        bus = await connect_bus(kernel)
        assert kernel.database_url is not None
        conn = await asyncpg.connect(libpq_url(kernel.database_url))
        state_dir, log = tmp_path / "trainer", tmp_path / "trainer.log"
        process = await asyncio.to_thread(start_trainer, kernel, state_dir, trajectory.address, log)
        try:
            groups = [await submit_group(bus, trajectory.address, index=i) for i in range(2)]

            async def first_step_committed() -> bool:
                assert process.poll() is None, log.read_text()[-3000:]
                try:
                    return len(await committed_steps(conn)) >= 1
                except asyncpg.UndefinedTableError:  # not migrated yet
                    return False

            await eventually(first_step_committed, timeout_s=90, what="the first step")
            os.kill(process.pid, signal.SIGKILL)
            assert await asyncio.to_thread(process.wait, 10) == -signal.SIGKILL
            before = await committed_steps(conn)
            assert 1 <= len(before) <= 2
            # More groups become ready while the trainer is down: they wait in its durable consumer.
            groups += [await submit_group(bus, trajectory.address, index=i) for i in range(2, NUM_GROUPS)]
            process = await asyncio.to_thread(start_trainer, kernel, state_dir, trajectory.address, log)

            async def all_steps_committed() -> bool:
                assert process.poll() is None, log.read_text()[-3000:]
                return len(await committed_steps(conn)) >= NUM_GROUPS

            await eventually(all_steps_committed, timeout_s=90, what=f"{NUM_GROUPS} steps after the restart")
            after = await committed_steps(conn)
            assert after[: len(before)] == before  # committed steps are kept as they were
            assert [v for v, _ in after] == list(range(1, NUM_GROUPS + 1))  # resumed at len(before) + 1
            trained = [t for _, task_ids in after for t in task_ids]
            assert sorted(trained) == sorted(groups)  # each group exactly once: none twice, none skipped
            # ... and in the order the groups became ready (calls may complete a later-submitted
            # group first: readiness waits for every recorded call, not for submission order)
            ready = await events_on_bus(kernel, "trajectory", trajectory_events.GroupReady)
            assert trained == [r.task_id for r in ready]
            consumed = await conn.fetch("SELECT task_id, consumed_version FROM trainer.ready_groups")
            assert {str(r["task_id"]): r["consumed_version"] for r in consumed} == {
                t: v for v, task_ids in after for t in task_ids
            }
            assert (checkpoint_folder(state_dir / "checkpoints", NUM_GROUPS) / "meta.json").exists()

            async def all_events_out() -> bool:
                return len(await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)) >= NUM_GROUPS

            await eventually(all_events_out, timeout_s=20, what="StepCompleted events")
            events = await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)
            assert [(e.version.steps, list(e.task_ids)) for e in events] == after
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(process.wait, 20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    await asyncio.to_thread(process.wait, 10)
            await conn.close()
            await bus.close()
            await trajectory.stop()
