"""Async: a fixed rollout pool and a fixed training pool that never switch (pure).

`batch_sync=True, streaming=False` is vanilla one-step-off Async: the rollout pool generates the
next batch of B groups while the trainer trains the previous one, a batch is released only after
the previous batch has finished, and a step starts once all B groups of a batch are ready.
`batch_sync=False, streaming=True` is Async with streaming: the queue refills slots as they free
up and groups enter the running step as they become ready. Both obey the staleness bound.

Worked example (B=2, G=4, K=1, 1 rollout cell of 8 slots, version 0):
    vanilla, nothing admitted             -> admit 2 (batch 0)
    vanilla, g0 ready, g1 running         -> nothing: no step start, no new batch
    vanilla, g0, g1 ready                 -> assign (0, 1) and admit 2 (batch 1, cap (0+1+1)*2=4)
    streaming, g0 ready, g1 running       -> assign (0,), and refill the 4 slots g0 left: admit 1
"""

from __future__ import annotations

from services.scheduler.policy.staleness import admissible_groups, assign_ready, groups_to_admit
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig


def decide(view: ClusterView, config: PolicyConfig, *, streaming: bool, batch_sync: bool) -> Decision:
    assign = assign_ready(view, config, streaming=streaming)
    admit = groups_to_admit(
        admissible=admissible_groups(view, config, batch_sync=batch_sync),
        free_slots=view.rollout_cells * config.slots_per_cell - view.running,
        waiting=view.waiting,
        group_size=config.group_size,
    )
    return Decision(assign=assign, admit=admit)
