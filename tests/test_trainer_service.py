"""The trainer service on real NATS, Postgres and the real trajectory service.

GroupReady -> StreamSamples -> step -> StepCompleted + WeightsPublished, a satellite joining over
JoinStep and leaving over LeaveStep, SaveCheckpoint idempotency, and bad requests naming the field.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from trainer_stack import connect_bus, events_on_bus, eventually, fresh_kernel, start_trainer, submit_group

from gyre.bus import Bus
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from gyre.trainer.v1 import events_pb2, trainer_pb2, trainer_pb2_grpc
from services.trainer.core_cell import path_from_uri
from services.trainer.weights import WEIGHTS_FILE, file_sha256
from services.trajectory.config import TrajectorySettings
from services.trajectory.main import build as build_trajectory

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def expect_error(call: object, code: grpc.StatusCode, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == code, err.value
    assert field in (err.value.details() or ""), err.value.details()


@asynccontextmanager
async def trainer_and_trajectory(
    server_urls: tuple[str, str], tmp_path: Path, **settings: Any
) -> AsyncIterator[tuple[KernelSettings, ServiceHost, ServiceHost, Bus]]:
    """A trajectory service and a trainer (one group per step) on their own database and prefix."""
    async with fresh_kernel(*server_urls) as kernel:
        trajectory = await build_trajectory(TrajectorySettings(port=0), kernel)
        await trajectory.start()
        trainer = await start_trainer(kernel, trajectory.address, tmp_path / "trainer", **settings)
        bus = await connect_bus(kernel)
        try:
            yield kernel, trajectory, trainer, bus
        finally:
            await bus.close()
            await trainer.stop()
            await trajectory.stop()


async def test_group_ready_to_step_events_and_the_grpc_methods(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    async with trainer_and_trajectory(server_urls, tmp_path, dp_timeout_s=60) as (
        kernel,
        trajectory,
        trainer,
        bus,
    ):
        channel = grpc.aio.insecure_channel(trainer.address)
        stub = trainer_pb2_grpc.TrainerServiceStub(channel)
        satellite: subprocess.Popen[bytes] | None = None
        try:
            status = await stub.GetStatus(trainer_pb2.GetStatusRequest())
            assert status.version.steps == 0 and [m.cell_id for m in status.members] == ["cell-0"]

            async def steps_done(n: int) -> bool:
                return len(await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)) >= n

            first = await submit_group(bus, trajectory.address, index=0)
            await eventually(lambda: steps_done(1), timeout_s=30, what="step 1")
            [step] = await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)
            assert (step.version.steps, list(step.task_ids)) == (1, [first])
            assert step.num_samples == 2 and step.num_target_tokens == 6 and step.grad_norm > 0
            published = await events_on_bus(kernel, "trainer", events_pb2.WeightsPublished)
            assert [w.version.steps for w in published] == [0, 1]  # engines can start from version 0
            for w in published:
                assert file_sha256(path_from_uri(w.source_uri) / WEIGHTS_FILE) == w.sha256

            # A satellite asks JoinStep itself, then trains the next step with the core.
            argv = ["-m", "services.trainer.satellite", "--trainer", trainer.address, "--cell-id", "cell-7"]
            satellite = await asyncio.to_thread(subprocess.Popen, [sys.executable, *argv])

            async def joined() -> bool:
                return len((await stub.GetStatus(trainer_pb2.GetStatusRequest())).members) == 2 or any(
                    e.cell_id == "cell-7"
                    for e in await events_on_bus(kernel, "trainer", events_pb2.SatelliteJoined)
                )

            await eventually(joined, timeout_s=40, what="JoinStep from the satellite")
            second = await submit_group(bus, trajectory.address, index=1)
            await eventually(lambda: steps_done(2), timeout_s=60, what="step 2")
            steps = await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)
            assert (steps[1].version.steps, list(steps[1].task_ids)) == (2, [second])
            assert steps[1].max_dp_world_size == 2
            status = await stub.GetStatus(trainer_pb2.GetStatusRequest())
            assert status.version.steps == 2
            assert [(m.cell_id, m.dp_rank) for m in status.members] == [("cell-0", 0), ("cell-7", 1)]

            left = await stub.LeaveStep(trainer_pb2.LeaveStepRequest(request_id="leave-7", cell_id="cell-7"))
            assert left.num_micro_batches_reassigned == 0
            again = await stub.LeaveStep(trainer_pb2.LeaveStepRequest(request_id="leave-7", cell_id="cell-7"))
            assert again == left  # the same request_id answers the same
            assert await asyncio.to_thread(satellite.wait, 30) == 0
            await expect_error(
                stub.LeaveStep(trainer_pb2.LeaveStepRequest(request_id="leave-8", cell_id="cell-8")),
                grpc.StatusCode.NOT_FOUND,
                "cell-8",
            )

            saved = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(request_id="save-1"))
            assert saved.checkpoint.version.steps == 2
            assert (path_from_uri(saved.checkpoint.uri) / "meta.json").exists()
            assert saved.checkpoint.size_bytes > 0
            same = await stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(request_id="save-1"))
            assert same.checkpoint.checkpoint_id == saved.checkpoint.checkpoint_id
            copy_uri = (tmp_path / "kept").resolve().as_uri()
            await expect_error(
                stub.SaveCheckpoint(trainer_pb2.SaveCheckpointRequest(request_id="save-1", uri=copy_uri)),
                grpc.StatusCode.FAILED_PRECONDITION,
                "save-1",
            )
            copied = await stub.SaveCheckpoint(
                trainer_pb2.SaveCheckpointRequest(request_id="save-2", uri=copy_uri)
            )
            assert copied.checkpoint.uri == copy_uri and (tmp_path / "kept").is_dir()
            status = await stub.GetStatus(trainer_pb2.GetStatusRequest())
            assert status.last_checkpoint.checkpoint_id == copied.checkpoint.checkpoint_id

            async def checkpoints_saved() -> bool:
                return len(await events_on_bus(kernel, "trainer", events_pb2.CheckpointSaved)) >= 2

            await eventually(checkpoints_saved, timeout_s=30, what="CheckpointSaved of save-1 and save-2")
            saved_events = await events_on_bus(kernel, "trainer", events_pb2.CheckpointSaved)
            # one event per request id, each committed with its checkpoint's row and the stored answer
            assert sorted(e.request_id for e in saved_events) == ["save-1", "save-2"]

            join, leave = trainer_pb2.JoinStepRequest, trainer_pb2.LeaveStepRequest
            save = trainer_pb2.SaveCheckpointRequest
            for call, field in (
                (stub.JoinStep(join(request_id="", cell_id="c")), "request_id"),
                (stub.JoinStep(join(request_id="j 1", cell_id="c")), "request_id"),
                (stub.JoinStep(join(request_id="j-1")), "cell_id"),
                (stub.LeaveStep(leave(request_id="l-1", cell_id="c", immediate=True)), "immediate"),
                (stub.SaveCheckpoint(save(request_id="s-3", uri="s3://b/k")), "uri"),
            ):
                await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT, field)
            assert (await stub.GetStatus(trainer_pb2.GetStatusRequest())).version.steps == 2  # still serving
        finally:
            if satellite is not None and satellite.poll() is None:
                satellite.kill()
                satellite.wait(timeout=10)
            await channel.close()


async def test_executions_without_calls_do_not_hold_back_training(
    server_urls: tuple[str, str], tmp_path: Path
) -> None:
    """An execution that failed before its first model call has no calls, ever (the proxy counted
    none): its group trains without it, and a group with no calls at all leaves the queue, set aside."""
    async with trainer_and_trajectory(server_urls, tmp_path) as (
        kernel,
        trajectory,
        _,
        bus,
    ):

        async def steps() -> list[events_pb2.StepCompleted]:
            return await events_on_bus(kernel, "trainer", events_pb2.StepCompleted)

        async def steps_done(n: int) -> bool:
            return len(await steps()) >= n

        half = await submit_group(bus, trajectory.address, index=0, num_calling=1)
        await eventually(lambda: steps_done(1), timeout_s=60, what="the step of the half-recorded group")
        silent = await submit_group(bus, trajectory.address, index=1, num_calling=0)
        full = await submit_group(bus, trajectory.address, index=2)
        await eventually(lambda: steps_done(2), timeout_s=60, what="the step after the silent group")
        first, second = await steps()
        assert (list(first.task_ids), first.num_samples) == ([half], 1)
        assert (list(second.task_ids), second.num_samples) == ([full], 2)
        assert silent not in {t for s in await steps() for t in s.task_ids}
        # Said aloud, so a scheduler that assigned it to a step assigns another in its place.
        set_aside = await events_on_bus(kernel, "trainer", events_pb2.GroupSetAside)
        assert [(e.task_id, e.reason) for e in set_aside] == [
            (silent, "no execution of the group made a model call")
        ]
