"""`gyre replay`, `gyre replay step N` and `gyre staleness`: rebuild projections from the event log,
audit a step's batch, explain stale samples (shell)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from google.protobuf import timestamp_pb2

from gyre.errors import Conflict, GyreError, InvalidArgument, NotFound
from gyre_app.cli_tasks import JsonOpt, run
from gyre_app.client import GyreClient
from gyre_app.output import console, pairs, print_json, table
from gyre_app.replay_services import HELP, check_service, on_database, projection_of, replay_service_log
from gyre_app.staleness import Timeline, distribution, version_runs, waited_most_for, waits

if TYPE_CHECKING:
    from gyre_app.replay_step import StepReplay

replay_app = typer.Typer(help="Replay the event log: a step's exact batch, or a service's projections.")


def _projection_replay(log_range: Any, keep_scratch: bool) -> Any:
    """The trajectory call log's replay (services.trajectory.log_replay.LogReplay)."""
    from services.trajectory.log_replay import replay_and_diff

    return on_database("trajectory", lambda pg: replay_and_diff(pg, log_range, keep_scratch=keep_scratch))


@replay_app.callback(invoke_without_command=True)
def replay_projections(
    ctx: typer.Context,
    service: Annotated[str, typer.Option(help=HELP)] = "trajectory",
    since: Annotated[
        datetime | None,
        typer.Option(help="the rows an event (a call) recorded at or after this time touches (UTC)"),
    ] = None,
    from_position: Annotated[
        int | None, typer.Option(help="the rows an event at or after this log position touches (0 = first)")
    ] = None,
    execution: Annotated[
        list[str] | None, typer.Option(help="trajectory: this execution (repeatable)")
    ] = None,
    keep_scratch: Annotated[bool, typer.Option(help="keep the scratch schema to inspect it")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Rebuild a service's projections from its event log into a scratch schema and diff them against
    the live ones (exit 1 when they differ). `gyre replay step N` audits one training step instead.

    Replayable: trajectory (execution headers, trajectories, tree_calls from its call log); scheduler,
    runner, evaluator, trainer (the columns their own events determine, from their outboxes). The
    proxy, engines and cell agents keep no event-sourced projection."""
    if ctx.invoked_subcommand is not None:
        return
    check_service(service)
    if since is not None and since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    if service != "trajectory":
        if execution:
            raise InvalidArgument(
                "--execution", f"names trajectory executions; {service} replays by time or position"
            )
        _report_outbox(
            service,
            replay_service_log(service, since=since, from_position=from_position, keep_scratch=keep_scratch),
            keep_scratch,
            as_json,
        )
        return
    from services.trajectory.log_replay import LogRange

    result = _projection_replay(
        LogRange(execution_ids=tuple(execution or ()), since=since, from_position=from_position),
        keep_scratch,
    )
    if as_json:
        print_json(
            {
                "service": service,
                "scratch_schema": result.schema if keep_scratch else None,
                "num_executions": result.num_executions,
                "num_calls": result.num_calls,
                "events_per_s": round(result.num_calls / result.replay_s) if result.replay_s > 0 else None,
                "same": result.same,
                "diffs": [dataclasses.asdict(d) for d in result.diffs],
            }
        )
    else:
        _diff_table(
            f"{service}: {result.num_calls} calls of {result.num_executions} executions replayed",
            result.diffs,
        )
        if keep_scratch:
            console.print(f"scratch schema kept: {result.schema}")
    _refuse_difference(service, result.diffs, result.same)


def _diff_table(title: str, diffs: Any) -> None:
    table(
        title,
        ("projection", "live rows", "replayed rows", "only live", "only replayed"),
        ((d.table, d.num_live, d.num_replayed, len(d.only_live), len(d.only_replayed)) for d in diffs),
    )


def _refuse_difference(service: str, diffs: Any, same: bool) -> None:
    if not same:
        differing = ", ".join(d.table for d in diffs if not d.same)
        raise Conflict(f"the live {differing} projection(s) differ from what the {service} log rebuilds")


def _report_outbox(service: str, result: Any, keep_scratch: bool, as_json: bool) -> None:
    not_replayed = projection_of(service).not_replayed
    if as_json:
        print_json(
            {
                "service": service,
                "scratch_schema": result.schema if keep_scratch else None,
                "num_events": result.num_events,
                "same": result.same,
                "diffs": [dataclasses.asdict(d) for d in result.diffs],
                "not_replayed": not_replayed,
            }
        )
    else:
        _diff_table(f"{service}: {result.num_events} events replayed from its outbox", result.diffs)
        console.print(f"not rebuilt from {service}'s events: {not_replayed}")
        if keep_scratch:
            console.print(f"scratch schema kept: {result.schema}")
    _refuse_difference(service, result.diffs, result.same)


def _sample_rows(r: StepReplay) -> list[dict[str, Any]]:
    return [
        {
            "execution_id": s.execution_id,
            "trajectory_id": s.trajectory_id,
            "agent_role": s.agent_role,
            "num_tokens": len(s.token_ids),
            "num_targets": s.num_targets,
            "staleness_steps": r.staleness(s),
            "reward": s.reward,
            "advantage": s.advantage,
        }
        for s in r.trained
    ]


@replay_app.command("step")
def replay_step_command(
    version: Annotated[int, typer.Argument(help="the step, by the policy version it produced (>= 1)")],
    as_json: JsonOpt = False,
) -> None:
    """Re-derive exactly the samples step N trained on and compare their checksum with the trainer's."""
    if version < 1:
        raise InvalidArgument("N", f"a step is named by the version it produced, >= 1, got {version}")
    from gyre_app.replay_step import replay_step  # here: it brings numpy, ~0.25 s of every start

    r = run(lambda c: replay_step(c, version))
    if as_json:
        print_json(
            {
                "version": r.version,
                "task_ids": list(r.step.task_ids),
                "recorded_sha256": r.step.batch_sha256,
                "derived_sha256": r.derived_sha256,
                "match": r.matches,
                "num_fetched": len(r.fetched),
                "num_trained": len(r.trained),
                "samples": _sample_rows(r),
            }
        )
    else:
        table(
            f"step {r.version}: samples trained",
            ("trajectory_id", "role", "tokens", "targets", "staleness", "advantage"),
            (
                (
                    x["trajectory_id"],
                    x["agent_role"],
                    x["num_tokens"],
                    x["num_targets"],
                    x["staleness_steps"],
                    f"{x['advantage']:+.3f}",
                )
                for x in _sample_rows(r)
            ),
        )
        pairs(
            "checksum",
            [("recorded", r.step.batch_sha256), ("re-derived", r.derived_sha256), ("match", r.matches)],
        )
    if not r.matches:
        raise Conflict(
            f"step {version}: the re-derived batch ({r.derived_sha256[:16]}…) differs from the one the "
            f"trainer recorded ({r.step.batch_sha256[:16]}…): its calls or rewards changed since"
        )


def _when(ts: timestamp_pb2.Timestamp, present: bool) -> datetime | None:
    return ts.ToDatetime() if present else None


async def _timeline(
    client: GyreClient, task_id: str, execution_id: str, consumed_at: datetime
) -> tuple[Timeline, list[str]]:
    """The execution's stages from the scheduler and the runner; what could not be learned, said."""
    notes: list[str] = []
    admitted = started = ended = group_ended = None
    try:
        task = await client.get_task(task_id)
    except GyreError as exc:
        return Timeline(
            admitted_at=None, started_at=None, ended_at=None, group_ended_at=None, consumed_at=consumed_at
        ), [f"scheduler: {exc}"]
    admitted = _when(task.submitted_at, task.HasField("submitted_at"))
    try:
        runs = {e.execution_id: await client.runner_execution(e.execution_id) for e in task.executions}
        mine = runs[execution_id]
        started = _when(mine.started_at, mine.HasField("started_at"))
        ended = _when(mine.ended_at, mine.HasField("ended_at"))
        ends = [_when(e.ended_at, e.HasField("ended_at")) for e in runs.values()]
        group_ended = max(ends) if ends and all(ends) else None  # type: ignore[type-var]
    except (GyreError, KeyError) as exc:
        notes.append(f"runner: {exc}")
    timeline = Timeline(
        admitted_at=admitted,
        started_at=started,
        ended_at=ended,
        group_ended_at=group_ended,
        consumed_at=consumed_at,
    )
    return timeline, notes


async def _explain_step(client: GyreClient, version: int) -> dict[str, Any]:
    from gyre_app.replay_step import replay_step  # here: it brings numpy, ~0.25 s of every start

    r = await replay_step(client, version)
    consumed_at = r.step.completed_at.ToDatetime()
    stale = []
    for s in r.fetched:
        lag = r.staleness(s)
        if lag <= 0:
            continue
        timeline, notes = await _timeline(client, r.task_of[s.execution_id], s.execution_id, consumed_at)
        stale.append(
            {
                "trajectory_id": s.trajectory_id,
                "execution_id": s.execution_id,
                "staleness_steps": lag,
                "trained": s in r.trained,
                "tokens_by_version": [
                    {
                        "version": v.version,
                        "first_token": v.first,
                        "last_token": v.last,
                        "num_tokens": v.num_tokens,
                    }
                    for v in version_runs(s.policy_versions, s.loss_mask)
                ],
                "admitted_at": timeline.admitted_at,
                "started_at": timeline.started_at,
                "ended_at": timeline.ended_at,
                "group_ended_at": timeline.group_ended_at,
                "consumed_at": timeline.consumed_at,
                "waited_s": dict(waits(timeline)),
                "waited_most_for": waited_most_for(timeline),
                "notes": notes,
            }
        )
    return {
        "version": version,
        "trainer_version": r.trainer_version,
        "distribution": {str(k): v for k, v in distribution(r.staleness(s) for s in r.fetched).items()},
        "num_samples": len(r.fetched),
        "stale": stale,
    }


def staleness(
    step: Annotated[int | None, typer.Option(help="only this step (default: every step, or --last)")] = None,
    last: Annotated[int, typer.Option(help="the last N steps when --step is not given")] = 10,
    as_json: JsonOpt = False,
) -> None:
    """Per step, the staleness distribution; for each stale sample, the versions behind its tokens and
    when its execution was admitted, ran, and was consumed (and what it waited for longest)."""

    async def go(client: GyreClient) -> list[dict[str, Any]]:
        latest = (await client.trainer_status()).version.steps
        if step is not None:
            if not 1 <= step <= latest:
                raise NotFound(f"step {step} was never trained: the latest step is {latest}")
            versions = [step]
        else:
            versions = list(range(max(1, latest - last + 1), latest + 1))
        return [await _explain_step(client, v) for v in versions]

    steps = run(go)
    if as_json:
        print_json({"steps": steps})
        return
    if not steps:
        console.print("no step trained yet")
    for s in steps:
        dist = ", ".join(f"{k}: {v}" for k, v in s["distribution"].items())
        console.print(
            f"[bold]step {s['version']}[/bold] (trainer at v{s['trainer_version']}): staleness {{{dist}}}"
        )
        for x in s["stale"]:
            tokens = "; ".join(
                f"v{t['version']} tokens {t['first_token']}-{t['last_token']}" for t in x["tokens_by_version"]
            )
            fate = "trained" if x["trained"] else "dropped"
            console.print(
                f"  {x['trajectory_id']} stale {x['staleness_steps']} ({fate}): "
                f"{tokens}; admitted {x['admitted_at']}, consumed {x['consumed_at']}, "
                f"waited most for {x['waited_most_for']}"
            )


def register(app: typer.Typer) -> None:
    app.add_typer(replay_app, name="replay")
    app.command()(staleness)
