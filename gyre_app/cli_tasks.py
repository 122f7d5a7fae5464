"""`gyre submit | tasks | executions | cancel`: daily work over the public APIs (shell)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer

from gyre.errors import InvalidArgument, NotFound
from gyre.runner.v1 import runner_pb2
from gyre.scheduler.v1 import scheduler_pb2
from gyre_app.cli_import import tasks_import
from gyre_app.client import GyreClient, ServiceAddresses, Task, TaskProgress
from gyre_app.client.tasks_file import (
    MAX_UINT32,
    NumberedTask,
    TasksFileError,
    bundled_spec,
    decode_tasks_file,
    line_of,
    parse_tasks,
)
from gyre_app.output import JSON_HELP, console, message_dict, pairs, print_json, table

T = TypeVar("T")
JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]


def run(work: Callable[[GyreClient], Awaitable[T]]) -> T:
    """Run one command's calls on a client that is closed afterwards."""

    async def go() -> T:
        async with GyreClient(ServiceAddresses.resolve()) as client:
            return await work(client)

    return asyncio.run(go())


def task_dict(task: Task) -> dict[str, Any]:
    out = message_dict(task)
    out["state"] = scheduler_pb2.TaskState.Name(task.state).removeprefix("TASK_STATE_").lower()
    return out


def progress_dict(p: TaskProgress) -> dict[str, Any]:
    return {
        "task_id": p.task_id,
        "state": p.state,
        "group_size": p.group_size,
        "num_rewarded": p.num_rewarded,
        "ready": p.ready,
        "rewards": list(p.rewards),
        "num_unassessable": p.num_unassessable,
    }


def execution_state(e: runner_pb2.Execution) -> str:
    return runner_pb2.ExecutionState.Name(e.state).removeprefix("EXECUTION_STATE_").lower()


def _specs(
    file: Path | None, task: str | None, group_size: int, timeout_s: float, harness: str
) -> list[NumberedTask]:
    if (file is None) == (task is None):
        raise InvalidArgument(
            "FILE / --task", "give a JSON-lines file of tasks or --task NAME, not both or neither"
        )
    if file is not None:
        if not file.is_file():
            raise TasksFileError(f"{file}: no such file")
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise TasksFileError(f"{file}: cannot be read: {exc.strerror}") from None
        return parse_tasks(decode_tasks_file(data, source=str(file)), source=str(file))
    from gyre_app.container_tasks import container_specs, is_container_source
    from services.evaluator.taskset import load_task

    assert task is not None
    if not 1 <= group_size <= MAX_UINT32:
        raise InvalidArgument("--group-size", f"must be an integer from 1 to {MAX_UINT32}, got {group_size}")
    if is_container_source(Path(task)):
        found = container_specs(Path(task), group_size=group_size, timeout_s=timeout_s, harness=harness)
        return [NumberedTask(line=0, spec=spec) for spec in found]
    try:
        definition = load_task(task)
    except (InvalidArgument, NotFound, FileNotFoundError) as exc:
        raise InvalidArgument("--task", f"{task!r} is not a bundled task: {exc}") from None
    spec = bundled_spec(
        name=definition.name,
        family=definition.family,
        prompt=definition.prompt,
        group_size=group_size,
        timeout_s=timeout_s,
        harness=harness,
    )
    return [NumberedTask(line=0, spec=spec)]


def submit(
    file: Annotated[Path | None, typer.Argument(help="JSON-lines file, one TaskSpec a line")] = None,
    task: Annotated[
        str | None,
        typer.Option(help="a bundled task by name (e.g. slugfix), or an imported task folder or task set"),
    ] = None,
    group_size: Annotated[int, typer.Option(help="executions of the --task group")] = 2,
    timeout_s: Annotated[float, typer.Option(help="deadline of each --task execution")] = 600.0,
    harness: Annotated[str, typer.Option(help="harness of the --task executions")] = "gyre-agent",
    request_id: Annotated[
        str | None, typer.Option(help="idempotency key; a repeat returns the first answer")
    ] = None,
    watch: Annotated[bool, typer.Option(help="then follow the tasks until their groups are ready")] = False,
    watch_timeout_s: Annotated[float, typer.Option(help="give up watching after this long")] = 3600.0,
    as_json: JsonOpt = False,
) -> None:
    """Submit tasks to the scheduler: a JSON-lines file, or one bundled task with --task."""
    numbered = _specs(file, task, group_size, timeout_s, harness)
    source = str(file) if file is not None else "--task"

    async def send(client: GyreClient) -> list[Task]:
        try:
            return await client.submit([n.spec for n in numbered], request_id=request_id)
        except InvalidArgument as exc:
            where = line_of(exc.field, numbered, source=source) if file is not None else None
            raise (TasksFileError(f"{where}: {exc.problem}") if where else exc) from None

    async def follow(client: GyreClient) -> list[TaskProgress]:
        seen: list[TaskProgress] = []
        async for p in client.watch([t.task_id for t in tasks], timeout_s=watch_timeout_s):
            seen.append(p)
            if not as_json:
                failed = f" ({p.num_unassessable} not assessable)" if p.num_unassessable else ""
                rewarded = f"{p.num_rewarded}/{p.group_size} rewarded{failed}"
                console.print(f"{p.task_id} {p.state}: {rewarded}, ready={p.ready}")
        return seen

    tasks = run(send)
    if not as_json:
        table(
            "submitted",
            ("task_id", "name", "group_size", "executions"),
            (
                (t.task_id, t.spec.name, t.spec.group_size, " ".join(e.execution_id for e in t.executions))
                for t in tasks
            ),
        )
    seen = run(follow) if watch else []
    if as_json:
        out: dict[str, Any] = {"tasks": [task_dict(t) for t in tasks]}
        if watch:
            out["progress"] = [progress_dict(p) for p in seen]
        print_json(out)


tasks_app = typer.Typer(help="Tasks the scheduler holds.", no_args_is_help=True)
executions_app = typer.Typer(
    help="Executions: the runner's record and the trajectory service's tree.", no_args_is_help=True
)


@tasks_app.command(
    "generate",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def tasks_generate(ctx: typer.Context) -> None:
    """Write a seeded task set (`gyre tasks generate --help` for its options)."""
    # Reached only through typer's own dispatch (help listings); `main` forwards it before typer.
    from services.evaluator.generate.cli import main as generate

    code = generate(["generate", *ctx.args])
    if code:
        raise typer.Exit(code)


tasks_app.command("import")(tasks_import)


@tasks_app.command("list")
def tasks_list(
    state: Annotated[
        str, typer.Option(help="only tasks in this state: pending, admitted, running, done, graded, ...")
    ] = "",
    limit: Annotated[int, typer.Option(help="at most this many, oldest first (0: every task)")] = 100,
    page_token: Annotated[
        str, typer.Option(help="start after this token (a previous listing's next_page_token)")
    ] = "",
    as_json: JsonOpt = False,
) -> None:
    """List tasks, oldest first, with their states (the scheduler's ListTasks, page by page)."""
    if limit < 0:
        raise InvalidArgument("--limit", f"must be >= 0, got {limit}")
    page = run(lambda c: c.all_tasks(state=state, limit=limit, page_token=page_token))
    if as_json:
        print_json({"tasks": [task_dict(t) for t in page.tasks], "next_page_token": page.next_page_token})
        return
    more = f", more after --page-token {page.next_page_token}" if page.next_page_token else ""
    table(
        f"tasks ({len(page.tasks)}{more})",
        ("task_id", "name", "family", "state", "group", "submitted_at"),
        (
            (
                t.task_id,
                t.spec.name,
                t.spec.family,
                task_dict(t)["state"],
                t.spec.group_size,
                t.submitted_at.ToDatetime(),
            )
            for t in page.tasks
        ),
    )


@tasks_app.command("show")
def tasks_show(
    task_id: Annotated[str, typer.Argument(help="the task's id")], as_json: JsonOpt = False
) -> None:
    """One task: its spec, state, executions and the rewards its group holds."""

    async def go(client: GyreClient) -> tuple[Task, TaskProgress]:
        return await client.get_task(task_id), await client.progress(task_id)

    task, p = run(go)
    if as_json:
        print_json({"task": task_dict(task), "progress": progress_dict(p)})
        return
    pairs(
        f"task {task.task_id}",
        [
            ("name", task.spec.name),
            ("family", task.spec.family),
            ("state", p.state),
            ("harness", task.spec.harness),
            ("group", f"{p.num_rewarded}/{p.group_size} rewarded, ready={p.ready}"),
        ],
    )
    table(
        "executions",
        ("index", "execution_id", "reward"),
        (
            (e.index_in_group, e.execution_id, p.rewards[i] if i < len(p.rewards) else None)
            for i, e in enumerate(task.executions)
        ),
    )


def scheduler_state(e: Any) -> str:
    return (
        str(e.DESCRIPTOR.fields_by_name["state"].enum_type.values_by_number[e.state].name)
        .removeprefix("EXECUTION_STATE_")
        .lower()
    )


@executions_app.command("list")
def executions_list(
    task: Annotated[str, typer.Option(help="only this task's executions")] = "",
    limit: Annotated[int, typer.Option(help="at most this many (0: the scheduler's default)")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """List executions with their states, as the scheduler tracks them (its ListExecutions RPC)."""
    found = run(lambda c: c.list_executions(task_id=task, limit=limit))
    if as_json:
        print_json({"executions": [message_dict(e) | {"state": scheduler_state(e)} for e in found]})
        return
    table(
        "executions",
        ("execution_id", "task_id", "index", "state", "replaced_by / replaces"),
        (
            (
                e.execution.execution_id,
                e.execution.task_id,
                e.execution.index_in_group,
                scheduler_state(e),
                e.replaced_by or e.replaces,  # an infrastructure failure and its replacement
            )
            for e in found
        ),
    )


@executions_app.command("show")
def executions_show(
    execution_id: Annotated[str, typer.Argument(help="the execution's id")], as_json: JsonOpt = False
) -> None:
    """One execution: state, times, workspace, and its calls and trajectories once recorded."""
    detail = run(lambda c: c.get_execution(execution_id))
    e = detail.execution
    if as_json:
        out: dict[str, Any] = {"execution": message_dict(e), "state": execution_state(e)}
        out["tree"] = message_dict(detail.tree) if detail.tree is not None else None
        print_json(out)
        return
    pairs(
        f"execution {execution_id}",
        [
            ("task", e.execution.task_id),
            ("state", execution_state(e)),
            ("harness", e.harness),
            ("started", e.started_at.ToDatetime().isoformat() if e.HasField("started_at") else None),
            ("ended", e.ended_at.ToDatetime().isoformat() if e.HasField("ended_at") else None),
            ("workspace", e.workspace_uri),
            ("failure", e.failure.reason if e.HasField("failure") else None),
        ],
    )
    if detail.tree is not None:
        table(
            "trajectories",
            ("trajectory_id", "role", "calls", "tokens", "targets", "selected"),
            (
                (
                    t.trajectory_id,
                    t.agent_role,
                    len(t.call_ids),
                    t.num_tokens,
                    t.num_target_tokens,
                    t.selected,
                )
                for t in detail.tree.trajectories
            ),
        )


def cancel(
    ids: Annotated[list[str], typer.Argument(help="execution ids (or task ids with --task)")],
    task: Annotated[
        bool, typer.Option("--task", help="the ids are tasks: cancel their whole groups")
    ] = False,
    reason: Annotated[
        str, typer.Option(help="why, copied to ExecutionCancelled")
    ] = "cancelled with gyre cancel",
    as_json: JsonOpt = False,
) -> None:
    """Cancel executions (the runner kills the harness, keeps the workspace) or, with --task, tasks."""

    if task:
        answers = run(lambda c: _cancel_tasks(c, ids, reason))
        if as_json:
            print_json(
                {"tasks": [{"task_id": t} | message_dict(a) for t, a in zip(ids, answers, strict=True)]}
            )
        else:
            table(
                "cancelled tasks",
                ("task_id", "answer"),
                ((t, message_dict(a)) for t, a in zip(ids, answers, strict=True)),
            )
        return

    async def go(client: GyreClient) -> list[runner_pb2.Execution]:
        return [await client.cancel_execution(e, reason=reason) for e in ids]

    done = run(go)
    if as_json:
        print_json({"executions": [message_dict(e) | {"state": execution_state(e)} for e in done]})
        return
    table(
        "cancelled", ("execution_id", "state"), ((e.execution.execution_id, execution_state(e)) for e in done)
    )


async def _cancel_tasks(client: GyreClient, task_ids: list[str], reason: str) -> list[Any]:
    return [await client.cancel_task(t, reason=reason) for t in task_ids]


def register(app: typer.Typer) -> None:
    app.command()(submit)
    app.command()(cancel)
    app.add_typer(tasks_app, name="tasks")
    app.add_typer(executions_app, name="executions")
