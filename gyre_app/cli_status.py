"""`gyre status`: the stack's health and what training waits for (shell: typer; the reasoning is
in `gyre_app.status_model`).

Each part is gathered on its own, so one that is away (Postgres restarting, a service down)
is named in the output while the rest is still shown: NATS and Postgres health, the number of
dead letters, each service's health, the trainer's step and version, the cells, the groups a
step can take with why each is not trained yet and since when, and running executions past
their deadline.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import typer

from gyre.errors import GyreError
from gyre.settings import KernelSettings, resolve_urls
from gyre_app.cli_tasks import JsonOpt, run, scheduler_state
from gyre_app.client import GyreClient
from gyre_app.dead_letters import count_dead_letters
from gyre_app.dependency_probe import connect_once, postgres_health
from gyre_app.output import message_dict, pairs, print_json, table
from gyre_app.status_model import (
    WAITING_TASK_STATES,
    ExecutionFact,
    TaskFact,
    overdue,
    step_waits,
)

MAX_TASKS = 200
"""Most waiting tasks (per state) and running executions looked at: status stays quick."""


async def _dependencies(kernel: KernelSettings) -> dict[str, Any]:
    """NATS and Postgres health and the dead-letter count, each `ok`, a number or `away: why`."""
    try:
        urls = resolve_urls(kernel)
    except GyreError as exc:
        return {"nats": f"unknown: {exc}", "postgres": f"unknown: {exc}", "dead_letters": "unknown"}
    out: dict[str, Any] = {"postgres": await postgres_health(urls.database_url)}
    try:
        nc = await connect_once(urls.nats_url)
    except GyreError as exc:
        return {"nats": f"away: {exc}", **out, "dead_letters": "unknown: NATS is away"}
    try:
        out["nats"] = "ok"
        out["dead_letters"] = await count_dead_letters(nc.jetstream(), kernel.bus_prefix)
    finally:
        await nc.close()
    return {"nats": out["nats"], "postgres": out["postgres"], "dead_letters": out["dead_letters"]}


async def _facts(client: GyreClient) -> tuple[list[TaskFact], list[ExecutionFact]]:
    tasks: list[TaskFact] = []
    for state in sorted(WAITING_TASK_STATES):
        page = await client.all_tasks(state=state, limit=MAX_TASKS)
        tasks += [
            TaskFact(
                task_id=t.task_id,
                state=state,
                submitted_at_s=t.submitted_at.seconds + t.submitted_at.nanos / 1e9,
                group_size=t.spec.group_size,
            )
            for t in page.tasks
        ]
    executions: list[ExecutionFact] = []
    for task in tasks[:MAX_TASKS]:
        for e in await client.list_executions(task_id=task.task_id):
            state, deadline_s = scheduler_state(e), None
            if state == "running":
                with_deadline = await client.runner_execution(e.execution.execution_id)
                if with_deadline.HasField("deadline"):
                    deadline_s = with_deadline.deadline.seconds + with_deadline.deadline.nanos / 1e9
            executions.append(
                ExecutionFact(
                    execution_id=e.execution.execution_id,
                    task_id=task.task_id,
                    state=state,
                    deadline_s=deadline_s,
                )
            )
    return tasks, executions


async def _part(out: dict[str, Any], key: str, work: Any) -> None:
    """`out[key] = await work`, or `{"not_available": why}` when a service or dependency is away."""
    try:
        out[key] = await work
    except GyreError as exc:
        out[key] = {"not_available": str(exc)}


async def gather_status(client: GyreClient, kernel: KernelSettings, *, now_s: float) -> dict[str, Any]:
    out: dict[str, Any] = {"dependencies": await _dependencies(kernel)}
    out["services"] = {s: await client.health(s) for s in sorted(client.addresses.known)}

    try:
        trainer = await client.trainer_status()
        out["trainer"] = message_dict(trainer)
        out["version"] = trainer.version.steps
        out["last_step"] = message_dict(await client.step(out["version"])) if out["version"] > 0 else None
    except GyreError as exc:  # the trainer, or its database, away: named, the rest still shown
        out["trainer"], out["version"], out["last_step"] = {"not_available": str(exc)}, None, None

    async def waits() -> dict[str, Any]:
        tasks, executions = await _facts(client)
        return {
            "groups": [asdict(w) for w in step_waits(tasks, executions, now_s=now_s)],
            "past_deadline": [asdict(o) for o in overdue(executions, now_s=now_s)],
        }

    async def cells() -> dict[str, Any]:
        return message_dict(await client.cells())

    await _part(out, "cells", cells())
    await _part(out, "waiting", waits())
    return out


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def status(as_json: JsonOpt = False) -> None:
    """Health of NATS, Postgres and the services, dead letters, the trainer's step, and what
    training waits for: each group a step can take, why it is not trained yet and since when, and
    executions past their deadline. A part that cannot be read (its service or Postgres away) says
    why; the rest is still shown."""
    kernel = KernelSettings()
    out = run(lambda client: gather_status(client, kernel, now_s=time.time()))
    if as_json:
        print_json(out)
        return
    deps = out["dependencies"]
    table(
        "dependencies",
        ("part", "health"),
        [("nats", deps["nats"]), ("postgres", deps["postgres"]), ("dead letters", deps["dead_letters"])],
    )
    table("services", ("service", "health"), out["services"].items())
    trainer = out["trainer"]
    if "not_available" in trainer:
        pairs("trainer", [("trainer", f"not available: {trainer['not_available']}")])
    else:
        rows: list[tuple[str, Any]] = [
            ("policy version", out["version"]),
            ("groups queued", trainer["num_groups_queued"]),
            ("step in progress", trainer.get("step", {}).get("target_version", {}).get("steps", "none")),
            ("members", ", ".join(m["cell_id"] for m in trainer["members"])),
            ("max staleness", trainer["max_staleness_steps"]),
        ]
        if out["last_step"]:
            s = out["last_step"]
            rows += [
                (
                    "last step staleness mean/max",
                    f"{s['staleness_mean_steps']:.2f} / {s['staleness_max_steps']}",
                ),
                (
                    "last step samples (dropped stale)",
                    f"{s['num_samples']} ({s['num_samples_dropped_stale']})",
                ),
            ]
        pairs("trainer", rows)
    cells = out["cells"]
    if "not_available" in cells:
        pairs("cells", [("cells", f"not available: {cells['not_available']}")])
    else:
        roles = ", ".join(
            f"{c['cell_id']}: {c['role'].removeprefix('CELL_ROLE_').lower()}" for c in cells.get("cells", [])
        )
        pairs("cells", [("cells", f"{roles} (mode {cells.get('mode', '')})")])
    waiting = out["waiting"]
    if "not_available" in waiting:
        pairs("waiting", [("groups", f"not available: {waiting['not_available']}")])
        return
    table(
        "groups a step can take, and what each waits for",
        ("task", "state", "waits for", "waiting"),
        ((w["task_id"], w["state"], w["why"], _ago(w["waited_s"])) for w in waiting["groups"]),
    )
    if waiting["past_deadline"]:
        table(
            "running past their deadline",
            ("execution", "task", "past deadline"),
            ((o["execution_id"], o["task_id"], _ago(o["past_deadline_s"])) for o in waiting["past_deadline"]),
        )


def register(app: typer.Typer) -> None:
    app.command()(status)
