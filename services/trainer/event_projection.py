"""The trainer's steps and checkpoints as far as its own events determine them (pure fold, for
`gyre replay`).

StepCompleted is enqueued in the transaction that records the step and marks its groups
consumed; CheckpointSaved in the one that records the checkpoint. Not rebuilt: `NOT_REPLAYED`.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC

from gyre.common.v1 import envelope_pb2
from gyre.db.outbox_replay import EventProjection, Row, TableProjection, decoded
from gyre.trainer.v1 import events_pb2

TABLES = (
    TableProjection(table="steps", key=("version",), columns=("version", "task_ids")),
    TableProjection(table="ready_groups", key=("task_id",), columns=("task_id", "consumed_version")),
    TableProjection(
        table="checkpoints",
        key=("checkpoint_id",),
        columns=("checkpoint_id", "version", "uri", "size_bytes", "saved_at"),
    ),
)
NOT_REPLAYED = (
    "the groups still queued and groups set aside (queued from the trajectory service's GroupReady), "
    "a step's "
    "report, checkpoint and weights folders, batch checksum and recipe, step assignments (the scheduler's "
    "StepAssigned)"
)


def fold(events: Sequence[envelope_pb2.Envelope]) -> Mapping[str, Mapping[Row, Row]]:
    steps: dict[Row, Row] = {}
    consumed: dict[Row, Row] = {}
    checkpoints: dict[Row, Row] = {}
    for event in decoded(events, [events_pb2.StepCompleted, events_pb2.CheckpointSaved]):
        p = event.payload
        if isinstance(p, events_pb2.StepCompleted):
            version = int(p.version.steps)
            steps[(version,)] = (version, json.dumps(list(p.task_ids)))
            for task_id in p.task_ids:
                consumed[(uuid.UUID(task_id),)] = (uuid.UUID(task_id), version)
        elif isinstance(p, events_pb2.CheckpointSaved):
            c = p.checkpoint
            key = (uuid.UUID(c.checkpoint_id),)
            checkpoints[key] = (
                *key,
                int(c.version.steps),
                c.uri,
                c.size_bytes,
                c.saved_at.ToDatetime(tzinfo=UTC),
            )
    return {"steps": steps, "ready_groups": consumed, "checkpoints": checkpoints}


PROJECTION = EventProjection(
    service="trainer", schema="trainer", tables=TABLES, fold=fold, not_replayed=NOT_REPLAYED
)
