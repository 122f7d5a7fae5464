"""A step of an emulated cluster in modelled time, with the real membership's joins and leaves (shell).

EMULATION ONLY. The emulated satellites compute nothing, so the gradient protocol's store
counters and gloo groups have no one to talk to; what stays real is `Membership`: `JoinStep`
and `LeaveStep` queue changes exactly as for real satellites, and this loop applies them at
microbatch-round boundaries (the epochs of the real protocol). Each round, every member takes one
microbatch and the round lasts as long as its largest one takes one cell at the modelled rate;
an epoch ends with a ring all-reduce of the gradients over its members, and the step with one
more. The weights are not touched (see `steps.EmulatedCompute`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from services.trainer.dp.membership import Membership


class StepTiming(Protocol):
    def compute_s(self, num_tokens: int) -> float: ...

    def allreduce_s(self, replicas: int) -> float: ...


def emulated_step(
    m: Membership, microbatch_tokens: Sequence[int], *, version: int, timing: StepTiming
) -> int:
    """Spend the step producing `version` in modelled time; returns the largest membership seen.

    Example: 4 microbatches of 1,000 tokens, the core alone, then a satellite joining after the
    first round: rounds [1000] and [1000, 1000] (2 members) then [1000]; one all-reduce of 2
    members at the join's epoch end and one at the step's end.
    """
    with m._lock:
        m.step_target = version
        m.done_in_step = 0
        m._apply_changes_locked()
    widest = 1
    try:
        i = 0
        while i < len(microbatch_tokens):
            world = len(m.members())
            widest = max(widest, world)
            batch = microbatch_tokens[i : i + world]
            i += len(batch)
            time.sleep(timing.compute_s(max(batch)))
            with m._lock:
                m.done_in_step += len(batch)
                pending = bool(m._m.pending_joins or m._m.pending_leaves)
            if pending and i < len(microbatch_tokens):  # an epoch ends: reduce, then the new members
                time.sleep(timing.allreduce_s(world))
                with m._lock:
                    m._apply_changes_locked()
        time.sleep(timing.allreduce_s(len(m.members())))
    finally:
        with m._lock:
            m.step_target = None
            m.current_version = version
            m._apply_changes_locked()
    return widest
