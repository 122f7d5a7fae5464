"""The scheduler's tables as far as its own events determine them (pure fold, for `gyre replay`).

TaskSubmitted carries each task as accepted (spec, executions, submission time), StepAssigned
the step its group was assigned to, ExecutionReplacementDecided a replacement execution added to a
group, CellRegistered a cell's registration. What other services'
events move (task and execution states, admission versions, training totals), cell roles and
heartbeats, and the mode are not rebuilt from this log: `NOT_REPLAYED` says so.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC

from gyre.common.v1 import envelope_pb2
from gyre.db.outbox_replay import EventProjection, Row, TableProjection, decoded
from gyre.scheduler.v1 import events_pb2
from services.scheduler.tasks import SCALAR_SPEC_FIELDS

TASK_COLUMNS = (
    "task_id",
    "request_id",
    *SCALAR_SPEC_FIELDS,
    "labels",
    "submitted_at",
    "deadline",
    "assigned_step",
)
CELL_COLUMNS = (
    "cell_id",
    "core",
    "slots",
    "model_fingerprint",
    "engine_id",
    "engine_address",
    "agent_address",
)
TABLES = (
    TableProjection(table="tasks", key=("task_id",), columns=TASK_COLUMNS),
    TableProjection(
        table="executions", key=("execution_id",), columns=("execution_id", "task_id", "index_in_group")
    ),
    TableProjection(table="cells", key=("cell_id",), columns=CELL_COLUMNS),
)
NOT_REPLAYED = (
    "task and execution states, admitted_version and trained_version (moved by the runner's, evaluator's "
    "and trainer's events), cell roles and heartbeats, the cluster row (mode, version, totals)"
)


def fold(events: Sequence[envelope_pb2.Envelope]) -> Mapping[str, Mapping[Row, Row]]:
    tasks: dict[Row, list[object]] = {}
    executions: dict[Row, Row] = {}
    cells: dict[Row, Row] = {}
    types = [
        events_pb2.TaskSubmitted,
        events_pb2.StepAssigned,
        events_pb2.CellRegistered,
        events_pb2.ExecutionReplacementDecided,
    ]
    for event in decoded(events, types):
        p = event.payload
        if isinstance(p, events_pb2.TaskSubmitted):
            t = p.task
            key = (uuid.UUID(t.task_id),)
            spec = [getattr(t.spec, name) for name in SCALAR_SPEC_FIELDS]
            deadline = t.spec.deadline.ToDatetime(tzinfo=UTC) if t.spec.HasField("deadline") else None
            submitted_at = t.submitted_at.ToDatetime(tzinfo=UTC)
            labels = json.dumps(dict(t.spec.labels))
            tasks[key] = [*key, p.request_id, *spec, labels, submitted_at, deadline, None]
            for e in t.executions:
                executions[(uuid.UUID(e.execution_id),)] = (uuid.UUID(e.execution_id), *key, e.index_in_group)
        elif isinstance(p, events_pb2.StepAssigned):
            for task_id in p.task_ids:
                # A task submitted before the replayed range is still touched by it; one the log
                # never submitted keeps its unknown columns empty, and the diff shows it.
                key = (uuid.UUID(task_id),)
                tasks.setdefault(key, [*key, *[None] * (len(TASK_COLUMNS) - 1)])[-1] = p.step
        elif isinstance(p, events_pb2.ExecutionReplacementDecided) and p.HasField("replacement"):
            r = p.replacement
            executions[(uuid.UUID(r.execution_id),)] = (
                uuid.UUID(r.execution_id),
                uuid.UUID(r.task_id),
                r.index_in_group,
            )
        elif isinstance(p, events_pb2.CellRegistered):
            c = p.cell
            cells[(c.cell_id,)] = tuple(getattr(c, name) for name in CELL_COLUMNS)
    return {"tasks": {k: tuple(v) for k, v in tasks.items()}, "executions": executions, "cells": cells}


PROJECTION = EventProjection(
    service="scheduler", schema="scheduler", tables=TABLES, fold=fold, not_replayed=NOT_REPLAYED
)
