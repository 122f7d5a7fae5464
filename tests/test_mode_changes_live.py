"""Any sequence of SetMode calls leaves every satellite in a role the new mode wants.

Live: the real scheduler and its driver, proxy, trainer (core cell), torch engines and the cells'
agents with their training workers, on real NATS and Postgres (`bench.cell_rig`); switches run
through every phase. The property runs a few hypothesis-drawn sequences (derandomized) of (a
satellite switched to training by hand, then a SetMode); after each, every settled satellite must
reach a role the mode wants (`policy.liveness.wanted_roles`): in async that is rollout, since a
fixed split never moves a cell itself. Hypothesis drives the rig's event loop on a thread, as
`test_fuzz_http` does.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.cell_rig import LiveCells, live_cells
from gyre.devstack.scratch import scratch_kernel
from gyre.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.cells import MODES
from services.scheduler.policy.liveness import wanted_roles

pytestmark = pytest.mark.slow
PROTO_MODE = {m: pb.SchedulingMode.Value(f"SCHEDULING_MODE_{m.upper()}") for m in MODES}
ROLE_NAME = {pb.CELL_ROLE_ROLLOUT: "rollout", pb.CELL_ROLE_TRAINING: "training"}


class Rig:
    """The live cells on an event loop of their own thread; `run` awaits a coroutine there."""

    def __init__(self, server_urls: tuple[str, str], model_dir: Path, state_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.stop = asyncio.Event()
        self.started: asyncio.Future[LiveCells] = self.loop.create_future()
        self.task = asyncio.run_coroutine_threadsafe(self._hold(server_urls, model_dir, state_dir), self.loop)
        self.cells: LiveCells = self.run(asyncio.wait_for(asyncio.shield(self.started), 240), timeout_s=300)

    async def _hold(self, server_urls: tuple[str, str], model_dir: Path, state_dir: Path) -> None:
        try:
            async with scratch_kernel(*server_urls, label="modes") as kernel:
                async with live_cells(kernel, model_dir, state_dir) as cells:
                    self.started.set_result(cells)
                    await self.stop.wait()
        except BaseException as exc:
            if not self.started.done():
                self.started.set_exception(exc)
            raise

    def run(self, coro: Any, *, timeout_s: float = 120) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.task.result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def rig(server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    from services.engine.model_init import init_model

    model_dir = init_model(tmp_path_factory.mktemp("tiny-model"))
    started = Rig(server_urls, model_dir, tmp_path_factory.mktemp("modes"))
    try:
        yield started
    finally:
        started.close()


async def set_mode(cells: LiveCells, mode: str) -> None:
    await cells.scheduler.SetMode(
        pb.SetModeRequest(request_id=f"mode-{uuid.uuid4().hex[:12]}", mode=PROTO_MODE[mode])
    )


async def to_training_by_hand(cells: LiveCells, cell_id: str) -> None:
    """What an operator's `gyre cells switch CELL training` does; refused while the cell switches."""
    try:
        await cells.switch(cell_id, pb.CELL_ROLE_TRAINING)
    except grpc.aio.AioRpcError as exc:
        assert exc.code() == grpc.StatusCode.FAILED_PRECONDITION, exc.details()


async def settled_as_wanted(cells: LiveCells, mode: str, *, timeout_s: float = 60) -> dict[str, str]:
    """Wait until every satellite holds a settled role `mode` wants; those roles."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        roles = await cells.roles()
        satellites = {c: ROLE_NAME.get(roles[c], "other") for c in cells.satellites}
        if all(r in wanted_roles(mode) for r in satellites.values()):
            return satellites
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"in {mode}, satellites stayed {satellites}")
        await asyncio.sleep(0.2)


def test_set_mode_async_between_steps_sends_a_training_satellite_back_to_rollout(rig: Rig) -> None:
    async def case() -> dict[str, str]:
        await set_mode(rig.cells, "gyre")
        switch = await rig.cells.switch("cell-1", pb.CELL_ROLE_TRAINING)
        assert switch.ok, switch.error
        await set_mode(rig.cells, "async")  # no step runs: it takes effect at once
        return await settled_as_wanted(rig.cells, "async")

    assert rig.run(case()) == {"cell-1": "rollout", "cell-2": "rollout"}


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(st.tuples(st.sampled_from(MODES), st.sampled_from(["cell-1", "cell-2"])), min_size=3, max_size=4)
)
def test_any_sequence_of_modes_leaves_every_satellite_in_a_role_the_mode_wants(
    rig: Rig, sequence: list[tuple[str, str]]
) -> None:
    async def play() -> None:
        for mode, by_hand in sequence:
            await to_training_by_hand(rig.cells, by_hand)
            await set_mode(rig.cells, mode)
            await settled_as_wanted(rig.cells, mode)

    rig.run(play(), timeout_s=240)


def test_gyre_mode_and_gyre_cells_switch_drive_the_scheduler(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from gyre_app.cli import app

    monkeypatch.setenv("GYRE_SCHEDULER_ADDRESS", rig.cells.scheduler_address)

    def gyre_json(*argv: str) -> Any:
        result = CliRunner().invoke(app, [*argv, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout.strip().splitlines()[-1])

    assert gyre_json("mode", "async")["mode"] == "async"
    rig.run(settled_as_wanted(rig.cells, "async"))  # every satellite serving, whatever ran before
    assert gyre_json("mode", "gyre")["mode"] == "gyre"
    assert gyre_json("cells", "switch", "cell-2", "training")["switch"]["ok"] is True
    assert gyre_json("mode", "ASYNC") == {"previous_mode": "gyre", "mode": "async", "pending": False}
    assert rig.run(settled_as_wanted(rig.cells, "async"))["cell-2"] == "rollout"
    assert gyre_json("mode") == {"mode": "async"}


def test_a_mode_or_role_the_scheduler_does_not_know_is_one_line_naming_the_field() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", "mode", "fast"], capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr.strip()) == (
        2,  # an input error's exit code
        "gyre mode: mode: must be one of colocate, async, gyre, burst, got 'fast'",
    )
