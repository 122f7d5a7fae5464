"""Dynamic data parallelism when the same satellite leaves and rejoins quickly, as colocate and the
elastic modes do every step: each rejoin forms a new group (no stale epoch, no collective timeout),
every step has the right members and the same gradient, and a join that cannot happen fails fast.

The satellite is one warm `--standby` worker, as a cell's agent keeps it: one session per join.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from trainer_builders import tiny_model, tree_samples

from services.trainer.dp import DataParallelCore
from services.trainer.loss import LossConfig
from services.trainer.microbatch import plan_microbatches


class Worker:
    """The warm training worker of a satellite cell (what `services.cell.agent` drives)."""

    def __init__(self, cell_id: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.trainer.satellite", "--cell-id", cell_id, "--standby"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.released: list[str] = []
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.line() == "ready"

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.put(raw.strip())

    def line(self) -> str:
        return self.lines.get(timeout=60)  # a session that never ends fails the test, not hangs it

    def wait_released(self) -> None:
        line = self.line()
        assert line.startswith("released"), line
        self.released.append(line)

    def train(self, rendezvous_uri: str) -> None:
        """Hand it a session; a release it had yet to report comes first."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(rendezvous_uri + "\n")
        self.proc.stdin.flush()
        line = self.line()
        if line.startswith("released"):
            self.released.append(line)
            line = self.line()
        assert line == f"accepted {rendezvous_uri}"

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def worker() -> Iterator[Worker]:
    w = Worker("cell-1")
    yield w
    w.stop()


def test_a_satellite_that_leaves_and_rejoins_quickly_trains_every_step_with_the_right_members(
    worker: Worker,
) -> None:
    model = tiny_model()
    # A short collective timeout: a rejoin that formed a stale group would fail the test in
    # seconds instead of stalling it.
    core = DataParallelCore(
        model_config=model.config, loss_config=LossConfig(), timeout_s=20, join_timeout_s=20
    )
    microbatches = plan_microbatches(tree_samples(model, num_executions=4), max_tokens=2_000)
    assert len(microbatches) >= 2
    alone = core.compute_step_gradient(model, microbatches, version=1)
    scale = float(alone.grad_P.abs().max())
    for version in range(2, 7):
        assert core.request_join("cell-1").admitted
        worker.train(core.rendezvous_uri)
        step = core.compute_step_gradient(model, microbatches, version=version)
        assert step.max_world_size == 2 and step.attempts == 1 and step.lost_cells == ()
        assert core.members() == ("cell-0", "cell-1")
        assert float((step.grad_P - alone.grad_P).abs().max()) / scale <= 1e-6
        core.request_leave("cell-1").result(timeout=30)
        assert core.members() == ("cell-0",)
        if version % 2 == 0:  # every other time the next join comes before the worker reported
            worker.wait_released()  # its release; the old session must end all the same
    assert len(worker.released) == 5
    assert core.lost == []


def test_a_join_whose_satellite_never_comes_fails_fast_and_the_step_trains_without_it() -> None:
    model = tiny_model()
    core = DataParallelCore(
        model_config=model.config,
        loss_config=LossConfig(),
        timeout_s=120,
        dead_after_s=1.0,
        join_timeout_s=2.0,
    )
    microbatches = plan_microbatches(tree_samples(model, num_executions=2), max_tokens=10_000)
    assert core.request_join("cell-9").admitted  # nobody will take this session up
    step = core.compute_step_gradient(model, microbatches, version=1)
    assert (step.max_world_size, step.attempts, step.lost_cells) == (1, 1, ("cell-9",))
    assert core.members() == ("cell-0",) and core.lost == ["cell-9"]
