"""Conversions between the scheduler's protobuf contract and its domain records (pure)."""

from __future__ import annotations

from gyre.common.v1 import ids_pb2
from gyre.scheduler.v1 import events_pb2
from gyre.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.tasks import SCALAR_SPEC_FIELDS, PlannedTask, TaskSpec, spec_from_record


def spec_from_proto(msg: pb.TaskSpec) -> TaskSpec:
    return spec_from_record(msg, labels=msg.labels)


def spec_to_proto(spec: TaskSpec) -> pb.TaskSpec:
    return pb.TaskSpec(**{name: getattr(spec, name) for name in SCALAR_SPEC_FIELDS}, labels=dict(spec.labels))


def task_to_proto(task: PlannedTask, *, state: pb.TaskState.ValueType = pb.TASK_STATE_PENDING) -> pb.Task:
    msg = pb.Task(
        task_id=task.task_id,
        spec=spec_to_proto(task.spec),
        state=state,
        executions=[
            ids_pb2.ExecutionRef(
                task_id=task.task_id, execution_id=e.execution_id, index_in_group=e.index_in_group
            )
            for e in task.executions
        ],
    )
    msg.submitted_at.FromDatetime(task.submitted_at)
    return msg


def execution_scheduled(task: pb.Task, execution: ids_pb2.ExecutionRef) -> events_pb2.ExecutionScheduled:
    """What the runner and the evaluator need to run and grade one execution of `task`."""
    spec = task.spec
    return events_pb2.ExecutionScheduled(
        execution=execution,
        task_name=spec.name,
        family=spec.family,
        prompt=spec.prompt,
        harness=spec.harness,
        workspace_template=spec.workspace_template,
        timeout_s=spec.timeout_s,
        labels=dict(spec.labels),
    )
