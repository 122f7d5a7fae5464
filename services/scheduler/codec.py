"""Conversions between the scheduler's protobuf contract and its domain records (pure)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

from gyre.common.v1 import ids_pb2
from gyre.scheduler.v1 import events_pb2
from gyre.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.cells import CellRecord, Registration
from services.scheduler.runner_offers import HarnessOffer, RunnerOffer, offer_from_request
from services.scheduler.tasks import (
    DEFAULT_INFRA_RETRIES,
    SCALAR_SPEC_FIELDS,
    PlannedTask,
    TaskSpec,
    spec_from_record,
)


def spec_from_proto(msg: pb.TaskSpec) -> TaskSpec:
    deadline = msg.deadline.ToDatetime(tzinfo=UTC) if msg.HasField("deadline") else None
    spec = spec_from_record(msg, labels=msg.labels, deadline=deadline, harness_env=msg.harness_env)
    if not msg.HasField("max_infra_retries"):  # unset is the default, not 0
        spec = dataclasses.replace(spec, max_infra_retries=DEFAULT_INFRA_RETRIES)
    return spec


def spec_to_proto(spec: TaskSpec) -> pb.TaskSpec:
    msg = pb.TaskSpec(
        **{name: getattr(spec, name) for name in SCALAR_SPEC_FIELDS},
        labels=dict(spec.labels),
        harness_env=dict(spec.harness_env),
    )
    if spec.deadline is not None:
        msg.deadline.FromDatetime(spec.deadline)
    return msg


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


def execution_scheduled(
    task: pb.Task, execution: ids_pb2.ExecutionRef, *, admitted_version: int, timeout_s: float | None = None
) -> events_pb2.ExecutionScheduled:
    """What the runner and the evaluator need to run and grade one execution of `task`
    (`timeout_s`: its limit when the task's deadline cuts it, else the task's timeout;
    `admitted_version`: the trainer's version at admission, the oldest weights its calls may use)."""
    spec = task.spec
    return events_pb2.ExecutionScheduled(
        admitted_version=ids_pb2.PolicyVersion(steps=admitted_version),
        execution=execution,
        task_name=spec.name,
        family=spec.family,
        prompt=spec.prompt,
        harness=spec.harness,
        workspace_template=spec.workspace_template,
        timeout_s=spec.timeout_s if timeout_s is None else timeout_s,
        labels=dict(spec.labels),
        harness_env=dict(spec.harness_env),
    )


ROLE_TO_PROTO = {
    "rollout": pb.CELL_ROLE_ROLLOUT,
    "training": pb.CELL_ROLE_TRAINING,
    "switching": pb.CELL_ROLE_SWITCHING,
    "lost": pb.CELL_ROLE_LOST,
    "": pb.CELL_ROLE_UNSPECIFIED,
}
ROLE_FROM_PROTO = {v: k for k, v in ROLE_TO_PROTO.items()}
MODE_TO_PROTO = {
    "colocate": pb.SCHEDULING_MODE_COLOCATE,
    "async": pb.SCHEDULING_MODE_ASYNC,
    "gyre": pb.SCHEDULING_MODE_GYRE,
    "burst": pb.SCHEDULING_MODE_BURST,
}
MODE_FROM_PROTO = {v: k for k, v in MODE_TO_PROTO.items()}


def cell_to_proto(cell: CellRecord, *, last_heartbeat_at: datetime | None = None) -> pb.Cell:
    msg = pb.Cell(
        cell_id=cell.cell_id,
        role=ROLE_TO_PROTO[cell.role],
        target_role=ROLE_TO_PROTO[cell.target_role],
        core=cell.core,
        slots=cell.slots,
        model_fingerprint=cell.model_fingerprint,
        engine_id=cell.engine_id,
        engine_address=cell.engine_address,
        agent_address=cell.agent_address,
    )
    if last_heartbeat_at is not None:
        msg.last_heartbeat_at.FromDatetime(last_heartbeat_at)
    return msg


def registration_from_proto(msg: pb.RegisterCellRequest) -> Registration:
    return Registration(
        cell_id=msg.cell_id,
        core=msg.core,
        slots=msg.slots,
        model_fingerprint=msg.model_fingerprint,
        engine_id=msg.engine_id,
        engine_address=msg.engine_address,
        agent_address=msg.agent_address,
    )


def runner_offer_from_proto(msg: pb.RegisterRunnerRequest) -> RunnerOffer:
    return offer_from_request(
        msg.runner_id,
        {
            h.name: HarnessOffer(binary=h.binary, binary_found=h.binary_found, env_values=dict(h.env_values))
            for h in msg.harnesses
        },
        task_sets=msg.task_sets,
        task_set_tasks=msg.task_set_tasks,
        template_url_prefixes=msg.template_url_prefixes,
        reserved_env=msg.reserved_env,
    )
