"""Loss weights recomputed after samples were dropped, so DESIGN section 4 holds exactly (pure).

The trajectory service weighs each selected unique target of execution e in a batch of E
executions 1/(E*U_e), counting a target shared by several trajectories once, in the first sample
that holds it. Dropping a sample (a last resort: staleness is bounded by admission) would leave
its execution's weights summing below 1/E, count a vanished execution in E, and, when the dropped
sample held the counted copy of a shared target, lose that target for every sample. So after a
drop:

1. a counted target of a dropped sample moves to the first kept sample of the same execution that
   holds the same tree position: samples of one execution all start at the tree's root, so the
   same position is the same token prefix;
2. U_e is recounted over the kept samples, E counts only executions that still have a target,
   and every counted target weighs 1/(E*U_e) again; context stays at 0.

Example (E=2: execution a has samples a1, a2 sharing target t; b has b1):
    a1 (t counted, u) dropped  -> a2 now counts t: a's targets {t, a2's own}, U_a = 2
    E stays 2 -> a2's targets weigh 1/4 each, b1's 1/(2*U_b)
    b1 dropped instead         -> E = 1: a's targets weigh 1/U_a
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from services.trainer.samples import Sample


def _holds_position(sample: Sample, prefix: tuple[int, ...]) -> bool:
    return len(sample.token_ids) >= len(prefix) and sample.token_ids[: len(prefix)] == prefix


def reweigh(kept: Sequence[Sample], dropped: Sequence[Sample]) -> tuple[Sample, ...]:
    """The kept samples with their loss masks and weights recomputed as if the dropped never were."""
    counted = [[m and w > 0 for m, w in zip(s.loss_mask, s.token_weight, strict=True)] for s in kept]
    for gone in dropped:
        for t, (m, w) in enumerate(zip(gone.loss_mask, gone.token_weight, strict=True)):
            if not (m and w > 0):
                continue
            prefix = gone.token_ids[: t + 1]
            for i, s in enumerate(kept):
                if s.execution_id == gone.execution_id and _holds_position(s, prefix):
                    counted[i][t] = True
                    break
    unique: dict[str, int] = {}
    for s, marks in zip(kept, counted, strict=True):
        unique[s.execution_id] = unique.get(s.execution_id, 0) + sum(marks)
    contributing = sum(1 for n in unique.values() if n > 0)
    out = []
    for s, marks in zip(kept, counted, strict=True):
        u = unique[s.execution_id]
        weight = 1.0 / (contributing * u) if u else 0.0
        out.append(
            dataclasses.replace(
                s,
                loss_mask=tuple(m or c for m, c in zip(s.loss_mask, marks, strict=True)),
                token_weight=tuple(weight if c else 0.0 for c in marks),
            )
        )
    return tuple(out)
