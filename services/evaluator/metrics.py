"""The evaluator's Prometheus series, from the rewards it publishes (shell)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from gyre.evaluator.v1 import events_pb2
from gyre.metrics import on_published

REWARDS = Histogram(
    "gyre_evaluator_reward",
    "Scores of assessable grades; partial: graded from a timed-out or crashed execution's workspace.",
    ["partial"],
    buckets=(0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)
UNASSESSABLE = Counter("gyre_evaluator_unassessable_total", "Grades recorded as not assessable.")


def observe_reward(event: events_pb2.RewardAssigned) -> None:
    if event.grade.assessable:
        REWARDS.labels(partial=str(event.grade.partial).lower()).observe(event.grade.score)
    else:
        UNASSESSABLE.inc()


def register() -> None:
    on_published(events_pb2.RewardAssigned, observe_reward)
