"""Conversions between the runner's contract and its records (pure)."""

from __future__ import annotations

from typing import Any

from gyre.common.v1 import ids_pb2
from gyre.runner.v1 import runner_pb2 as pb
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from services.runner.executions import Launch, grading_task

STATE_VALUES = {
    "starting": pb.EXECUTION_STATE_STARTING,
    "running": pb.EXECUTION_STATE_RUNNING,
    "finished": pb.EXECUTION_STATE_FINISHED,
    "timed_out": pb.EXECUTION_STATE_TIMED_OUT,
    "failed": pb.EXECUTION_STATE_FAILED,
    "cancelled": pb.EXECUTION_STATE_CANCELLED,
}
FAILURE_VALUES = {
    "workspace": pb.EXECUTION_FAILURE_KIND_WORKSPACE,
    "sandbox": pb.EXECUTION_FAILURE_KIND_SANDBOX,
    "harness_launch": pb.EXECUTION_FAILURE_KIND_HARNESS_LAUNCH,
    "proxy": pb.EXECUTION_FAILURE_KIND_PROXY,
    "runner_lost": pb.EXECUTION_FAILURE_KIND_RUNNER_LOST,
    "harness_crashed": pb.EXECUTION_FAILURE_KIND_HARNESS_CRASHED,
    "model_unavailable": pb.EXECUTION_FAILURE_KIND_MODEL_UNAVAILABLE,
}


def launch_from_request(request: pb.StartExecutionRequest, *, task: str) -> Launch:
    return Launch(
        request_id=request.request_id,
        task_id=request.execution.task_id,
        execution_id=request.execution.execution_id,
        index_in_group=request.execution.index_in_group,
        harness=request.harness,
        prompt=request.prompt,
        workspace_template=request.workspace_template,
        timeout_s=request.timeout_s,
        family=request.family,
        task=task,
        harness_env=tuple(sorted(request.harness_env.items())),
    )


def launch_from_scheduled(event_id: str, p: scheduler_events.ExecutionScheduled) -> Launch:
    """The launch of an execution the scheduler scheduled (its task's harness_env included)."""
    return Launch(
        request_id=f"scheduled:{event_id}",
        task_id=p.execution.task_id,
        execution_id=p.execution.execution_id,
        index_in_group=p.execution.index_in_group,
        harness=p.harness,
        prompt=p.prompt,
        workspace_template=p.workspace_template,
        timeout_s=p.timeout_s,
        family=p.family,
        task=grading_task(workspace_template=p.workspace_template, labels=dict(p.labels)),
        min_policy_version=p.admitted_version.steps,
        harness_env=tuple(sorted(p.harness_env.items())),
    )


def execution_to_proto(row: Any) -> pb.Execution:
    """A row of runner.executions as the API's Execution."""
    msg = pb.Execution(
        execution=ids_pb2.ExecutionRef(
            task_id=str(row.task_id), execution_id=str(row.execution_id), index_in_group=row.index_in_group
        ),
        harness=row.harness,
        state=STATE_VALUES[row.state],
        workspace_uri=row.workspace_uri,
        family=row.family,
        task=row.task,
    )
    for name in ("started_at", "deadline", "ended_at"):
        if getattr(row, name) is not None:
            getattr(msg, name).FromDatetime(getattr(row, name))
    if row.exit_code is not None:
        msg.exit_code = row.exit_code
    if row.failure_kind:
        msg.failure.CopyFrom(
            pb.ExecutionFailure(kind=FAILURE_VALUES[row.failure_kind], reason=row.failure_reason)
        )
    return msg


def execution_ref(launch: Launch) -> ids_pb2.ExecutionRef:
    return ids_pb2.ExecutionRef(
        task_id=launch.task_id, execution_id=launch.execution_id, index_in_group=launch.index_in_group
    )
