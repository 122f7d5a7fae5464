"""A satellite switched both ways while a harness's stream is open, on real NATS and Postgres with
torch engines, the trainer and the cells' training-worker processes: the stream finishes with
exactly the tokens of an undisturbed run, and the scheduler (not the test) routed every engine."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from proxy_support import greedy_stream

from bench.cell_rig import LiveCells, live_cells
from gyre.devstack.scratch import scratch_kernel
from gyre.proxy.v1 import proxy_pb2
from gyre.scheduler.v1 import scheduler_pb2 as pb

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from services.engine.model_init import init_model

    return init_model(tmp_path_factory.mktemp("tiny-model"))


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cells(
    server_urls: tuple[str, str], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[LiveCells]:
    async with scratch_kernel(*server_urls, label="cells") as kernel:
        async with live_cells(kernel, tiny_model, tmp_path_factory.mktemp("cells")) as live:
            yield live


async def stream_text(live: LiveCells, *, max_tokens: int, during: object = None) -> str:
    """One greedy streaming call; `during(parts)` runs between chunks (and may switch cells)."""
    return await greedy_stream(
        live.http_url,
        await live.register_execution(),
        max_tokens=max_tokens,
        during=during,  # type: ignore[arg-type]
    )


async def test_the_scheduler_routes_every_satellite_it_registered(cells: LiveCells) -> None:
    routing = await cells.proxy.GetRouting(proxy_pb2.GetRoutingRequest())
    assert sorted(r.cell_id for r in routing.routes if r.state == proxy_pb2.ROUTE_STATE_ACTIVE) == [
        "cell-1",
        "cell-2",
    ]
    assert await cells.roles() == {
        "cell-0": pb.CELL_ROLE_TRAINING,
        "cell-1": pb.CELL_ROLE_ROLLOUT,
        "cell-2": pb.CELL_ROLE_ROLLOUT,
    }


async def test_a_cell_switched_both_ways_under_an_open_stream_leaves_it_intact(cells: LiveCells) -> None:
    # 400 tokens, switched at the first chunk: on a loaded machine the engine can finish 200 tokens
    # before the test reads its sixth chunk, and a drain then has no generation left to move.
    undisturbed = await stream_text(cells, max_tokens=400)
    switches: list[pb.CellSwitch] = []

    async def switch_both_ways(parts: list[str]) -> None:
        if len(parts) == 1 and not switches:
            busy = await cells.busy_cell()
            switches.append(await cells.switch(busy, pb.CELL_ROLE_TRAINING))
            assert (await cells.roles())[busy] == pb.CELL_ROLE_TRAINING
            switches.append(await cells.switch(busy, pb.CELL_ROLE_ROLLOUT))

    switched = await stream_text(cells, max_tokens=400, during=switch_both_ways)
    assert switched == undisturbed
    out, back = switches
    assert out.ok and back.ok, (out.error, back.error)
    assert out.num_calls_migrated == 1 and out.kv_transferred_bytes > 0
    assert (out.to_role, back.to_role) == (pb.CELL_ROLE_TRAINING, pb.CELL_ROLE_ROLLOUT)
    assert all(
        x > 0
        for x in (out.drain_s, out.release_s, out.join_s, back.leave_s, back.weight_load_s, back.route_s)
    )
    assert set((await cells.roles()).values()) == {pb.CELL_ROLE_TRAINING, pb.CELL_ROLE_ROLLOUT}


async def test_a_switch_of_a_cell_already_switching_is_refused(cells: LiveCells) -> None:
    first = asyncio.ensure_future(cells.switch("cell-2", pb.CELL_ROLE_TRAINING))
    for _ in range(400):  # until the first switch has marked the cell
        if (await cells.roles())["cell-2"] == pb.CELL_ROLE_SWITCHING or first.done():
            break
        await asyncio.sleep(0.005)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cells.switch("cell-2", pb.CELL_ROLE_TRAINING)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "cell_id" in (err.value.details() or "") and "switching" in (err.value.details() or "")
    assert (await first).ok
    assert (await cells.switch("cell-2", pb.CELL_ROLE_ROLLOUT)).ok


async def test_a_switch_failing_midway_ends_serving_again(cells: LiveCells) -> None:
    """Its agent is gone, so the join fails after the engine released its memory: the scheduler
    reloads the weights and routes the cell again, and it serves the next call. (Last: the cell
    has no agent afterwards.)"""
    await cells.agents["cell-2"].stop(grace_s=0)
    failed = await cells.switch("cell-2", pb.CELL_ROLE_TRAINING)
    assert not failed.ok and failed.error.startswith("join")
    assert failed.to_role == pb.CELL_ROLE_ROLLOUT and failed.weight_load_s > 0
    assert (await cells.roles())["cell-2"] == pb.CELL_ROLE_ROLLOUT
    assert (await cells.switch("cell-1", pb.CELL_ROLE_TRAINING)).ok  # cell-2 alone serves now
    assert await stream_text(cells, max_tokens=20)
