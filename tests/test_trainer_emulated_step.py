"""The trainer's modelled step (EMULATION ONLY): members join and leave through the real membership
at microbatch-round boundaries, each round takes its largest microbatch's time, an epoch with a
change ends in an all-reduce, and the step in one more."""

from __future__ import annotations

from dataclasses import dataclass, field

from services.trainer.dp.emulated import emulated_step
from services.trainer.dp.membership import Membership
from services.trainer.steps import EmulatedCompute


@dataclass
class Recorder:
    """Timing that records what the step charged (and charges nothing, so the test takes no time)."""

    rounds: list[int] = field(default_factory=list)
    reductions: list[int] = field(default_factory=list)
    on_round: object = None

    def compute_s(self, num_tokens: int) -> float:
        self.rounds.append(num_tokens)
        if callable(self.on_round):
            self.on_round()
        return 0.0

    def allreduce_s(self, replicas: int) -> float:
        self.reductions.append(replicas)
        return 0.0


def membership() -> Membership:
    return Membership(host="127.0.0.1", port=0, cell_id="cell-0", timeout_s=5.0, dead_after_s=5.0)


def test_the_core_alone_takes_every_microbatch_in_turn() -> None:
    m, timing = membership(), Recorder()
    assert emulated_step(m, [300, 100, 200], version=1, timing=timing) == 1
    assert timing.rounds == [300, 100, 200]
    assert timing.reductions == [1]
    assert m.current_version == 1 and m.step_target is None


def test_a_satellite_joining_mid_step_shares_the_rounds_after_the_epoch_ends() -> None:
    m = membership()
    timing = Recorder()
    timing.on_round = lambda: m.request_join("cell-1") if len(timing.rounds) == 1 else None
    widest = emulated_step(m, [100, 100, 100, 100, 50], version=1, timing=timing)
    assert widest == 2
    # Round 1 alone; the join ends the epoch (an all-reduce of one member); then pairs.
    assert timing.rounds == [100, 100, 100]
    assert timing.reductions == [1, 2]
    assert m.members() == ("cell-0", "cell-1")


def test_a_leave_asked_mid_step_resolves_at_the_next_round_boundary() -> None:
    m = membership()
    m.request_join("cell-1")
    timing = Recorder()
    left = []
    timing.on_round = lambda: left.append(m.request_leave("cell-1")) if not left else None
    emulated_step(m, [100, 100, 100, 100], version=1, timing=timing)
    assert left[0].result(timeout=1).target_version == 1
    assert m.members() == ("cell-0",)
    assert timing.rounds == [100, 100, 100]  # a pair, then the core alone twice


def test_the_ring_all_reduce_moves_two_n_minus_one_over_n_of_the_gradients() -> None:
    compute = EmulatedCompute(tokens_per_s=1000.0, gradient_bytes=4e11, link_bytes_per_s=4e11, time_scale=2.0)
    assert compute.allreduce_s(1) == 0.0
    assert compute.allreduce_s(4) == 2.0 * 3 / 4 / 2.0
    assert compute.compute_s(500) == 0.25
