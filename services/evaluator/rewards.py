"""Grade a workspace for an execution and build its Grade message (shell around the pure scorer)."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from gyre.errors import InvalidArgument
from gyre.evaluator.v1 import evaluator_pb2 as pb
from services.evaluator.container_grading import ContainerGrader
from services.evaluator.container_task import (
    AGENT_DIFF,
    AGENT_LOG,
    CONTAINER_FAMILIES,
    ContainerTask,
    load_container_task,
    read_family,
)
from services.evaluator.grading import Graded, Grader
from services.evaluator.scoring import ERRORED, FAILED, PASSED, Scored, not_assessable
from services.evaluator.taskset import TaskDef, load_task, task_folder

OUTCOMES = {
    PASSED: pb.CHECK_OUTCOME_PASSED,
    FAILED: pb.CHECK_OUTCOME_FAILED,
    ERRORED: pb.CHECK_OUTCOME_ERRORED,
}


def workspace_path(uri: str) -> Path:
    parts = urllib.parse.urlsplit(uri)
    if parts.scheme != "file" or not parts.path:
        raise InvalidArgument("workspace_uri", f"must be a file:// URI of a folder, got {uri!r}")
    return Path(urllib.parse.unquote(parts.path))


def task_for(ref: str, *, family: str, tasks_dir: Path) -> TaskDef | ContainerTask:
    """The task definition to grade with; InvalidArgument when missing or of another family."""
    folder = task_folder(ref, bundled=tasks_dir)
    definition: TaskDef | ContainerTask
    if family in CONTAINER_FAMILIES or read_family(folder) in CONTAINER_FAMILIES:
        definition = load_container_task(folder)
    else:
        definition = load_task(ref, bundled=tasks_dir)
    if family and definition.family != family:
        raise InvalidArgument("family", f"task {definition.name!r} is {definition.family}, not {family}")
    return definition


def grade_message(
    *,
    execution_id: str,
    task_id: str,
    scored: Scored,
    partial: bool,
    grader: str,
    duration_s: float,
    signals: Sequence[str] = (),
) -> pb.Grade:
    grade = pb.Grade(
        execution_id=execution_id,
        task_id=task_id,
        score=scored.score,
        assessable=scored.assessable,
        unassessable_reason=scored.reason[:4096],
        partial=partial,
        grader=grader,
        duration_s=duration_s,
        signals=[s[:1024] for s in signals],
        checks=[
            pb.CheckResult(
                name=c.name,
                outcome=OUTCOMES[c.outcome],
                weight=c.weight,
                score=c.score,
                detail=c.detail[:4096],
            )
            for c in scored.checks
        ],
    )
    grade.graded_at.FromDatetime(datetime.now(UTC))
    return grade


async def grade_execution(
    grader: Grader,
    *,
    tasks_dir: Path,
    execution_id: str,
    task_id: str,
    family: str,
    task: str,
    workspace_uri: str,
    partial: bool,
) -> pb.Grade:
    """Grade, turning a missing task definition into `not assessable` with the reason."""
    try:
        definition = task_for(task, family=family, tasks_dir=tasks_dir)
        if isinstance(definition, ContainerTask):
            graded = await grade_container_workspace(
                grader.containers, definition, workspace_path(workspace_uri)
            )
        else:
            graded = await grader.grade(definition, workspace_path(workspace_uri))
    except InvalidArgument as exc:
        graded = Graded(
            scored=not_assessable(f"cannot grade: {exc}"),
            grader=f"{family or 'unknown'}@0",
            duration_s=0.0,
            attempts=0,
        )
    return grade_message(
        execution_id=execution_id,
        task_id=task_id,
        scored=graded.scored,
        partial=partial,
        grader=graded.grader,
        duration_s=graded.duration_s,
        signals=graded.signals,
    )


async def grade_container_workspace(
    containers: ContainerGrader | None, task: ContainerTask, workspace: Path
) -> Graded:
    """Grade the diff the runner exported from the agent's container (`agent.diff`, beside the
    agent's log) in a fresh container of the task's image."""
    grader = f"{task.family}@0"
    if containers is None:
        return Graded(
            scored=not_assessable("the evaluator's host has no container engine (podman or docker)"),
            grader=grader,
            duration_s=0.0,
            attempts=0,
        )
    try:
        diff = await asyncio.to_thread((workspace / AGENT_DIFF).read_bytes)
    except OSError as exc:  # written by the runner on the host, after the agent: its failure
        return Graded(
            scored=not_assessable(f"the runner exported no {AGENT_DIFF}: {exc}"),
            grader=grader,
            duration_s=0.0,
            attempts=0,
        )
    try:
        agent_log = (await asyncio.to_thread((workspace / AGENT_LOG).read_bytes))[-(1 << 20) :]
    except OSError:
        agent_log = b""
    return await containers.grade(task, diff, agent_log=agent_log.decode(errors="replace"))
