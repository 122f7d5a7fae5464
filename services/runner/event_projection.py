"""The runner's executions as far as its own events determine them (pure fold, for `gyre replay`).

ExecutionStarted gives a started execution's workspace, start and deadline; its one end event
(finished, timed out, failed, cancelled) its final state, exit code and failure kind. A row is
written in the transaction that enqueues each of these events. Not rebuilt: `NOT_REPLAYED`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC
from typing import Any

from gyre.common.v1 import envelope_pb2
from gyre.db.outbox_replay import EventProjection, Row, TableProjection, decoded
from gyre.runner.v1 import events_pb2
from services.runner.codec import FAILURE_VALUES

COLUMNS = (
    "execution_id",
    "task_id",
    "index_in_group",
    "state",
    "workspace_uri",
    "started_at",
    "deadline",
    "exit_code",
    "failure_kind",
    "failure_reason",
)
FAILURE_NAMES = {value: name for name, value in FAILURE_VALUES.items()}
ENDS: dict[type[Any], str] = {
    events_pb2.ExecutionFinished: "finished",
    events_pb2.ExecutionTimedOut: "timed_out",
    events_pb2.ExecutionFailed: "failed",
    events_pb2.ExecutionCancelled: "cancelled",
}
NOT_REPLAYED = (
    "executions that have not started (no event yet), the harness, family, task and timeout an execution "
    "was launched with, ended_at (the commit's clock), created_at; the rpc_requests log"
)


def fold(events: Sequence[envelope_pb2.Envelope]) -> Mapping[str, Mapping[Row, Row]]:
    rows: dict[Row, dict[str, Any]] = {}
    for event in decoded(events, [events_pb2.ExecutionStarted, *ENDS]):
        p: Any = event.payload
        ref = p.execution
        key = (uuid.UUID(ref.execution_id),)
        row = rows.setdefault(
            key,
            dict.fromkeys(COLUMNS)
            | {
                "execution_id": key[0],
                "task_id": uuid.UUID(ref.task_id),
                "index_in_group": ref.index_in_group,
            }
            | {"workspace_uri": "", "failure_kind": "", "failure_reason": ""},
        )
        if isinstance(p, events_pb2.ExecutionStarted):
            row["state"] = "running"
            row["workspace_uri"] = p.workspace_uri
            row["started_at"] = p.started_at.ToDatetime(tzinfo=UTC)
            row["deadline"] = p.deadline.ToDatetime(tzinfo=UTC)
            continue
        row["state"] = ENDS[type(p)]
        if isinstance(p, events_pb2.ExecutionFinished):
            row["exit_code"] = p.exit_code
        elif isinstance(p, events_pb2.ExecutionFailed):
            row["failure_kind"] = FAILURE_NAMES[p.failure.kind]
            row["failure_reason"] = p.failure.reason
            row["workspace_uri"] = p.workspace_uri
            row["exit_code"] = p.exit_code if p.HasField("exit_code") else None
    return {"executions": {k: tuple(r[c] for c in COLUMNS) for k, r in rows.items()}}


PROJECTION = EventProjection(
    service="runner",
    schema="runner",
    tables=(TableProjection(table="executions", key=("execution_id",), columns=COLUMNS),),
    fold=fold,
    not_replayed=NOT_REPLAYED,
)
