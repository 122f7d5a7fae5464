"""The scheduler's Prometheus series, from the events it publishes (shell)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from gyre.metrics import on_published
from gyre.scheduler.v1 import events_pb2

INFRA_FAILURES = Counter(
    "gyre_scheduler_infra_failures_total",
    "Executions whose grade was not assessable (infrastructure failures), kept out of their group's "
    "baseline and loss; replaced: whether a replacement execution was scheduled in the group.",
    ["replaced"],
)

DECISION_SECONDS = Histogram(
    "gyre_scheduler_decision_seconds",
    "One decision round of the live driver: facts read from the tables, the policy, its decision applied.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)


def observe_decision(event: events_pb2.ExecutionReplacementDecided) -> None:
    if not event.cancelled:  # a cancelled task's grades are no infrastructure failure
        INFRA_FAILURES.labels(replaced=str(event.HasField("replacement")).lower()).inc()


def register() -> None:
    on_published(events_pb2.ExecutionReplacementDecided, observe_decision)
