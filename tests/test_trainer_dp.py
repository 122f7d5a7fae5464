"""Dynamic data parallelism: satellite processes (gloo on 127.0.0.1) join mid-step; the gradient holds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from trainer_builders import tiny_model, tree_samples

from services.trainer.dp import DataParallelCore
from services.trainer.loss import LossConfig
from services.trainer.microbatch import plan_microbatches


@pytest.fixture
def core() -> Iterator[DataParallelCore]:
    model = tiny_model()
    # Satellites start with the step (imports under load): joining may take as long as forming a group.
    yield DataParallelCore(
        model_config=model.config, loss_config=LossConfig(), timeout_s=90, join_timeout_s=90
    )


def start_satellite(core: DataParallelCore, cell_id: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.trainer.satellite",
            "--rendezvous",
            core.rendezvous_uri,
            "--cell-id",
            cell_id,
        ]
    )


def test_step_gradient_is_the_same_whoever_computes_which_microbatch(core: DataParallelCore) -> None:
    model = tiny_model()
    microbatches = plan_microbatches(tree_samples(model, num_executions=6), max_tokens=10_000)
    alone = core.compute_step_gradient(model, microbatches, version=1)
    assert alone.max_world_size == 1
    satellites = [start_satellite(core, "cell-1"), start_satellite(core, "cell-2")]
    try:
        by_core = [0]

        def join_at(i: int) -> None:  # cell-1 after the core's first microbatch, cell-2 after its second
            by_core[0] += 1  # counted, not by index: a satellite may take microbatch 1 before the core
            if by_core[0] in (1, 2):
                assert core.request_join(f"cell-{by_core[0]}").admitted

        joined = core.compute_step_gradient(model, microbatches, version=2, after_microbatch=join_at)
        assert joined.max_world_size == 3
        assert joined.num_targets == alone.num_targets
        assert joined.loss == pytest.approx(alone.loss, abs=1e-6)
        scale = float(alone.grad_P.abs().max())
        assert float((joined.grad_P - alone.grad_P).abs().max()) / scale <= 1e-6
        left = core.request_leave("cell-1").result(timeout=30)
        assert core.members() == ("cell-0", "cell-2")
        assert satellites[0].wait(timeout=30) == 0
        # A new cell-1 process, started after the leave, waits for the next join (not the last one).
        satellites[0] = start_satellite(core, "cell-1")
        assert core.request_join("cell-1").admitted
        again = core.compute_step_gradient(model, microbatches, version=3)  # all three from the start
        assert again.max_world_size == 3 and again.lost_cells == ()
        assert float((again.grad_P - alone.grad_P).abs().max()) / scale <= 1e-6
        assert left.num_micro_batches_completed >= 0
        core.request_leave("cell-2").result(timeout=30)
        core.request_leave("cell-1").result(timeout=30)
        assert satellites[1].wait(timeout=30) == 0 and satellites[0].wait(timeout=30) == 0
    finally:
        for p in satellites:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_a_killed_satellite_costs_an_attempt_not_the_step_nor_its_exactness() -> None:
    model = tiny_model()
    core = DataParallelCore(
        model_config=model.config,
        loss_config=LossConfig(),
        timeout_s=60,
        dead_after_s=1.0,
        join_timeout_s=60,
    )
    microbatches = plan_microbatches(tree_samples(model, num_executions=6), max_tokens=10_000)
    alone = core.compute_step_gradient(model, microbatches, version=1)
    satellite = start_satellite(core, "cell-1")
    try:
        assert core.request_join("cell-1").admitted

        def kill_after_first(i: int) -> None:  # the core's first microbatch of the epoch with cell-1
            if core.members() == ("cell-0", "cell-1") and satellite.poll() is None:
                satellite.kill()

        gradient = core.compute_step_gradient(
            model, microbatches, version=2, after_microbatch=kill_after_first
        )
        assert satellite.wait(timeout=10) != 0
        assert (gradient.attempts, gradient.lost_cells, gradient.max_world_size) == (2, ("cell-1",), 1)
        assert core.members() == ("cell-0",) and core.lost == ["cell-1"]
        assert gradient.num_targets == alone.num_targets
        scale = float(alone.grad_P.abs().max())
        assert float((gradient.grad_P - alone.grad_P).abs().max()) / scale <= 1e-6
    finally:
        if satellite.poll() is None:
            satellite.kill()
            satellite.wait(timeout=10)
