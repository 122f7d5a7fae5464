"""Burst mode: one optimizer update per scheduling burst, for globally shuffled minibatches (pure).

A burst is B groups released together; the step that consumes them starts only when all B are
graded, so its minibatches can be shuffled across the whole burst (recipes that need that cannot
stream). The next burst is released once the current one has finished rolling out, and training
runs on the cells the rollout does not need: elastic satellites, migration and the core cell as in
Gyre, without streaming.

Worked example (B=2, G=4, K=1, 3 cells of 4 slots, core cell 0):
    version 0, nothing admitted     -> admit 2 (the burst fills satellites 1 and 2)
    g0 ready, g1 running             -> nothing: no partial step, no second burst yet
    g0, g1 ready                     -> assign (0, 1) and admit the next burst
"""

from __future__ import annotations

from services.scheduler.policy.elastic import ElasticKnobs
from services.scheduler.policy.elastic import decide as elastic_decide
from services.scheduler.policy.state import ClusterView, Decision, PolicyConfig

BURST = ElasticKnobs(streaming=False, batch_sync=True)


def decide(view: ClusterView, config: PolicyConfig) -> Decision:
    return elastic_decide(view, config, BURST)
