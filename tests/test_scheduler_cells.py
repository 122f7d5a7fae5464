"""Cells in the scheduler on real NATS and Postgres: registration, roles, modes, loss by silence,
bad input refused naming the field with the state unchanged, and all of it across a restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
import pytest_asyncio

from gyre.devstack.scratch import scratch_kernel
from gyre.rpc import ERROR_FIELD_TRAILER
from gyre.runtime import ServiceHost
from gyre.scheduler.v1 import scheduler_pb2 as pb
from gyre.scheduler.v1 import scheduler_pb2_grpc
from gyre.settings import KernelSettings
from services.scheduler.config import SchedulerSettings
from services.scheduler.main import build

pytestmark = pytest.mark.asyncio(loop_scope="session")
FINGERPRINT = "qwen2-0123456789abcdef"


@asynccontextmanager
async def scheduler(
    kernel: KernelSettings, **settings: object
) -> AsyncIterator[scheduler_pb2_grpc.SchedulerServiceAsyncStub]:
    host: ServiceHost = await build(SchedulerSettings(port=0, **settings), kernel)  # type: ignore[arg-type]
    await host.start()
    channel = grpc.aio.insecure_channel(host.address)
    try:
        yield scheduler_pb2_grpc.SchedulerServiceStub(channel)  # type: ignore[misc]
    finally:
        await channel.close()
        await host.stop(grace_s=1)


@pytest_asyncio.fixture(loop_scope="session")
async def own_kernel(server_urls: tuple[str, str]) -> AsyncIterator[KernelSettings]:
    """A database of its own: cells are cluster-wide state, so tests must not share them."""
    async with scratch_kernel(server_urls[0], server_urls[1], label="cells") as kernel:
        yield kernel


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def shared(
    server_urls: tuple[str, str],
) -> AsyncIterator[scheduler_pb2_grpc.SchedulerServiceAsyncStub]:
    """One cluster (core cell-0, satellite cell-1) for the tests that only read or are refused."""
    async with scratch_kernel(server_urls[0], server_urls[1], label="cells") as kernel:
        async with scheduler(kernel, mode="async", cell_lost_after_s=3600.0) as stub:
            await stub.RegisterCell(core())
            await stub.RegisterCell(satellite("cell-1"))
            yield stub


CLUSTER = {"cell-0": "CELL_ROLE_TRAINING", "cell-1": "CELL_ROLE_ROLLOUT"}


def satellite(name: str, **change: object) -> pb.RegisterCellRequest:
    fields: dict[str, object] = {
        "request_id": f"reg-{uuid.uuid4().hex[:8]}",
        "cell_id": name,
        "slots": 4,
        "model_fingerprint": FINGERPRINT,
        "engine_id": f"engine-{name}",
        "engine_address": "127.0.0.1:40001",
        "agent_address": "127.0.0.1:40002",
    }
    return pb.RegisterCellRequest(**{**fields, **change})  # type: ignore[arg-type]


def core(cell_id: str = "cell-0") -> pb.RegisterCellRequest:
    return pb.RegisterCellRequest(
        request_id=f"reg-{uuid.uuid4().hex[:8]}", cell_id=cell_id, core=True, agent_address="127.0.0.1:40000"
    )


async def roles(stub: scheduler_pb2_grpc.SchedulerServiceAsyncStub) -> dict[str, str]:
    cells = await stub.GetCells(pb.GetCellsRequest())
    return {c.cell_id: pb.CellRole.Name(c.role) for c in cells.cells}


async def refused(call: object, field: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call  # type: ignore[misc]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata() or ())[ERROR_FIELD_TRAILER] == field  # type: ignore[arg-type]


async def test_the_core_trains_and_satellites_start_in_rollout(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    assert await roles(shared) == CLUSTER


async def test_roles_and_mode_survive_a_restart(own_kernel: KernelSettings) -> None:
    async with scheduler(own_kernel) as stub:
        await stub.RegisterCell(core())
        await stub.RegisterCell(satellite("cell-1"))
        await stub.SetMode(pb.SetModeRequest(request_id="mode-1", mode=pb.SCHEDULING_MODE_BURST))
    async with scheduler(own_kernel, mode="colocate") as stub:
        cells = await stub.GetCells(pb.GetCellsRequest())
        assert cells.mode == pb.SCHEDULING_MODE_BURST
        assert [(c.cell_id, c.role, c.slots) for c in cells.cells] == [
            ("cell-0", pb.CELL_ROLE_TRAINING, 0),
            ("cell-1", pb.CELL_ROLE_ROLLOUT, 4),
        ]


async def test_a_second_core_cell_is_refused_and_nothing_changes(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    await refused(shared.RegisterCell(core("cell-9")), "core")
    assert await roles(shared) == CLUSTER


async def test_another_models_fingerprint_is_refused(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    await refused(
        shared.RegisterCell(satellite("cell-2", model_fingerprint="llama-feedbeef")), "model_fingerprint"
    )
    assert await roles(shared) == CLUSTER


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cell_id": "bad id"}, "cell_id"),
        ({"slots": 0}, "slots"),
        ({"engine_address": "nowhere"}, "engine_address"),
        ({"model_fingerprint": ""}, "model_fingerprint"),
    ],
)
async def test_bad_registrations_name_the_field(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub, change: dict[str, object], field: str
) -> None:
    await refused(shared.RegisterCell(satellite("cell-3", **change)), field)
    assert await roles(shared) == CLUSTER


async def test_an_unknown_mode_is_refused_and_the_mode_stays(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    mode = (await shared.GetCells(pb.GetCellsRequest())).mode
    await refused(
        shared.SetMode(pb.SetModeRequest(request_id="m-0", mode=pb.SCHEDULING_MODE_UNSPECIFIED)), "mode"
    )
    await refused(shared.SetMode(pb.SetModeRequest(request_id="m-99", mode=99)), "mode")  # type: ignore[arg-type]
    assert (await shared.GetCells(pb.GetCellsRequest())).mode == mode


async def test_set_mode_reports_the_previous_mode_once(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    before = (await shared.GetCells(pb.GetCellsRequest())).mode
    request = pb.SetModeRequest(request_id="mode-x", mode=pb.SCHEDULING_MODE_COLOCATE)
    first = await shared.SetMode(request)
    again = await shared.SetMode(request)
    assert (first.previous_mode, first.mode) == (before, pb.SCHEDULING_MODE_COLOCATE)
    assert again == first


async def test_switch_requests_for_unknown_core_or_unspecified_are_refused(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await shared.SwitchCell(
            pb.SwitchCellRequest(request_id="s-1", cell_id="cell-7", role=pb.CELL_ROLE_TRAINING)
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "cell_id" in (err.value.details() or "")
    await refused(
        shared.SwitchCell(
            pb.SwitchCellRequest(request_id="s-2", cell_id="cell-0", role=pb.CELL_ROLE_ROLLOUT)
        ),
        "cell_id",
    )
    await refused(shared.SwitchCell(pb.SwitchCellRequest(request_id="s-3", cell_id="cell-1")), "role")
    assert await roles(shared) == CLUSTER


async def test_a_heartbeat_from_an_unknown_cell_is_not_found(
    shared: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await shared.SendHeartbeat(pb.SendHeartbeatRequest(cell_id="cell-5"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_silent_cell_is_declared_lost_and_a_beating_one_is_not(own_kernel: KernelSettings) -> None:
    async with scheduler(own_kernel, cell_lost_after_s=0.6) as stub:
        await stub.RegisterCell(satellite("cell-1"))
        await stub.RegisterCell(satellite("cell-2"))
        for _ in range(12):  # 1.8 s: cell-2 beats, cell-1 stays silent
            await stub.SendHeartbeat(pb.SendHeartbeatRequest(cell_id="cell-2"))
            await asyncio.sleep(0.15)
        assert await roles(stub) == {"cell-1": "CELL_ROLE_LOST", "cell-2": "CELL_ROLE_ROLLOUT"}
        beat = await stub.SendHeartbeat(pb.SendHeartbeatRequest(cell_id="cell-1"))
        assert beat.role == pb.CELL_ROLE_LOST  # its agent learns it must register again
        await stub.RegisterCell(satellite("cell-1"))
        assert (await roles(stub))["cell-1"] == "CELL_ROLE_ROLLOUT"


async def test_the_policys_switch_costs_are_the_median_of_the_measured_switches() -> None:
    from services.scheduler.cell_control import CellControl

    control = CellControl(None, None, None, default_mode="gyre", lost_after_s=5.0)  # type: ignore[arg-type]
    assert control.measured_switch_s("training", default=0.5) == 0.5  # nothing measured yet
    control.switch_s["training"].extend([0.12, 0.31, 0.18])
    assert control.measured_switch_s("training", default=0.5) == 0.18
    assert control.measured_switch_s("rollout", default=0.5) == 0.5
