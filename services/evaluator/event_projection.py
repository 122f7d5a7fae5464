"""The evaluator's rewards rebuilt from its RewardAssigned events (pure fold, for `gyre replay`).

Every reward row is written in the transaction that enqueues its RewardAssigned, so the event
log determines each row but its `created_at` (the insert's clock).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from gyre.common.v1 import envelope_pb2
from gyre.db.outbox_replay import EventProjection, Row, TableProjection, decoded
from gyre.evaluator.v1 import events_pb2

REWARDS = TableProjection(
    table="rewards",
    key=("execution_id",),
    columns=("execution_id", "task_id", "score", "assessable", "grade"),
)


def fold(events: Sequence[envelope_pb2.Envelope]) -> Mapping[str, Mapping[Row, Row]]:
    rewards: dict[Row, Row] = {}
    for event in decoded(events, [events_pb2.RewardAssigned]):
        grade = event.payload.grade  # type: ignore[attr-defined]
        key = (uuid.UUID(grade.execution_id),)
        # The first reward stands: a repeat is never stored (insert ... on conflict do nothing).
        rewards.setdefault(
            key, (*key, grade.task_id, grade.score, grade.assessable, grade.SerializeToString())
        )
    return {"rewards": rewards}


PROJECTION = EventProjection(
    service="evaluator",
    schema="evaluator",
    tables=(REWARDS,),
    fold=fold,
    not_replayed="rewards.created_at (the insert's clock)",
)
