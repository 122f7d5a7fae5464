"""`gyre trace export`: a live run's executions and calls as a `gyre sim` workload trace (shell)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from gyre.errors import InvalidArgument, NotFound
from gyre.scheduler.v1 import scheduler_pb2
from gyre_app.cli_tasks import JsonOpt, run
from gyre_app.client import GyreClient
from gyre_app.output import pairs, print_json
from gyre_app.trace_export import HEADER, Assumed, ExecutionTrace, Measured, workload

trace_app = typer.Typer(help="Workload traces for `gyre sim`, measured on a live run.", no_args_is_help=True)
DEFAULTS = Assumed()
ENDED = (
    scheduler_pb2.EXECUTION_STATE_FINISHED,
    scheduler_pb2.EXECUTION_STATE_TIMED_OUT,
    scheduler_pb2.EXECUTION_STATE_FAILED,
    scheduler_pb2.EXECUTION_STATE_CANCELLED,
    scheduler_pb2.EXECUTION_STATE_GRADED,
    scheduler_pb2.EXECUTION_STATE_TRAINED,
    scheduler_pb2.EXECUTION_STATE_SET_ASIDE,
)


@dataclass(frozen=True, slots=True)
class Collected:
    traces: list[ExecutionTrace]
    skipped: dict[str, int]
    """Why an execution has no record (`not ended`, `no model call`) -> how many."""
    measured: Measured


async def _execution(
    client: GyreClient, execution: scheduler_pb2.Execution, *, timeout_s: float
) -> ExecutionTrace | str:
    """The execution's trace, or why it has none (replaced, still running, or no model call)."""
    if execution.state == scheduler_pb2.EXECUTION_STATE_INFRA_FAILED:
        return "replaced"  # an infrastructure failure: another execution took its place in the group
    if execution.state not in ENDED or not execution.HasField("duration_s"):
        return "not ended"
    ref = execution.execution
    try:
        tree = await client.execution_tree(ref.execution_id)
    except NotFound:
        return "no model call"
    latency, output = [], []
    for c in tree.calls:
        call = (await client.call(c.call_id)).call
        if call.HasField("started_at") and call.HasField("finished_at"):
            latency.append((call.finished_at.ToDatetime() - call.started_at.ToDatetime()).total_seconds())
        output.append(c.num_output_tokens)
    duration = max(1e-3, execution.duration_s)
    return ExecutionTrace(
        execution_id=ref.execution_id,
        task_id=ref.task_id,
        duration_s=duration,
        tokens=sum(t.num_tokens for t in tree.trajectories if t.selected),
        # Grading moves a timed-out execution on to `graded`: its length still says it (the
        # simulator decides timeouts the same way, duration >= timeout).
        timed_out=execution.state == scheduler_pb2.EXECUTION_STATE_TIMED_OUT or duration >= timeout_s,
        num_calls=len(tree.calls),
        call_latency_s=latency,
        call_output_tokens=output,
    )


async def collect(client: GyreClient, task_ids: list[str]) -> Collected:
    """The named tasks' executions (default: every trained step's), in admission order.

    Lengths come from the scheduler (`ListExecutions`), so no runner needs to be reachable; calls
    and tokens from the trajectory service; steps and the staleness bound from the trainer."""
    per_step: list[int] = []
    if not task_ids:
        latest = (await client.trainer_status()).version.steps
        if latest == 0:
            raise NotFound("no step trained yet: name the tasks to export with --task")
        for v in range(1, latest + 1):
            step = await client.step(v)
            per_step.append(len(step.task_ids))
            task_ids += list(step.task_ids)
    # Task ids are UUIDv7, so in submission order, and the scheduler admits the oldest task first:
    # sorted, they are in admission order, the order the simulator replays its trace in.
    task_ids = sorted(dict.fromkeys(task_ids))
    traces: list[ExecutionTrace] = []
    skipped: dict[str, int] = {}
    sizes, timeouts = [], []
    for task_id in task_ids:
        task = await client.get_task(task_id)
        sizes.append(task.spec.group_size)
        timeouts.append(task.spec.timeout_s)
        for execution in await client.list_executions(task_id=task_id):
            got = await _execution(client, execution, timeout_s=task.spec.timeout_s)
            if isinstance(got, str):
                skipped[got] = skipped.get(got, 0) + 1
            else:
                traces.append(got)
    staleness = (await client.trainer_status()).max_staleness_steps
    measured = Measured(
        group_sizes=sizes, groups_per_step=per_step, max_staleness=staleness, timeouts_s=timeouts
    )
    return Collected(traces=traces, skipped=skipped, measured=measured)


def check_name(name: str) -> None:
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InvalidArgument("--name", f"must be letters, digits, - and _, got {name!r}")


def check_out_dir(out_dir: Path) -> None:
    """Refuse a folder the export could not write, before any service is asked (made if missing).

    Tried, not judged from its mode bits: root may write where the bits say no, and nobody
    writes below a file or on a read-only mount whatever the bits say."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except (OSError, UnicodeEncodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidArgument(
            "OUT_DIR", f"{str(out_dir)!r} is not a folder this user can write: {why}"
        ) from None


def write(out_dir: Path, name: str, collected: Collected, assumed: Assumed) -> dict[str, Any]:
    """Write `<name>.jsonl` and `<name>.yaml` (only a workload `gyre sim` reads); the summary."""
    check_name(name)
    traces = collected.traces
    if not traces:
        raise NotFound(
            f"no ended execution with model calls to export (skipped: {collected.skipped or 'none'})"
        )
    if assumed.microbatch_tokens is None:
        # The trainer makes one microbatch per execution (`plan_microbatches`), so a round of the
        # simulator's (a microbatch per training cell) holds one execution's tokens: their mean.
        mean = round(statistics.mean(t.tokens for t in traces))
        assumed = dataclasses.replace(assumed, microbatch_tokens=max(1, mean))
    data = workload(name, f"{name}.jsonl", measured=collected.measured, assumed=assumed)
    from services.scheduler.sim.workload import parse_workload

    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path, workload_path = out_dir / f"{name}.jsonl", out_dir / f"{name}.yaml"
    trace_path.write_text("".join(json.dumps(t.record()) + "\n" for t in traces))
    parse_workload(data, base_dir=out_dir)  # refuse to leave a workload `gyre sim` would not read
    workload_path.write_text(HEADER + yaml.safe_dump(data, sort_keys=False))
    return {
        "workload": str(workload_path),
        "trace": str(trace_path),
        "num_executions": len(traces),
        "skipped": collected.skipped,
        "num_calls": sum(t.num_calls for t in traces),
    }


@trace_app.command("export")
def export(
    out_dir: Annotated[Path, typer.Argument(help="folder for <name>.yaml and <name>.jsonl")],
    name: Annotated[str, typer.Option(help="workload name and file stem")] = "live",
    task: Annotated[
        list[str] | None, typer.Option(help="export this task (repeatable); default: every trained step's")
    ] = None,
    cells: Annotated[int, typer.Option(help="assumed: cells in the simulated cluster")] = DEFAULTS.cells,
    async_rollout_cells: Annotated[
        int, typer.Option(help="assumed: Async's rollout pool")
    ] = DEFAULTS.async_rollout_cells,
    executions_per_cell: Annotated[
        int, typer.Option(help="assumed: slots per rollout cell")
    ] = DEFAULTS.executions_per_cell,
    tokens_per_s_per_cell: Annotated[
        float, typer.Option(help="assumed: training throughput")
    ] = DEFAULTS.tokens_per_s_per_cell,
    step_overhead_s: Annotated[
        float, typer.Option(help="assumed: update + publish per step")
    ] = DEFAULTS.step_overhead_s,
    rollout_to_training_s: Annotated[
        float, typer.Option(help="assumed: a switch into training")
    ] = DEFAULTS.rollout_to_training_s,
    training_to_rollout_s: Annotated[
        float, typer.Option(help="assumed: a switch back to rollout")
    ] = DEFAULTS.training_to_rollout_s,
    migrate_s: Annotated[float | None, typer.Option(help="assumed: pause of a moved execution")] = None,
    group_setup_s: Annotated[
        float | None, typer.Option(help="assumed: forming a data-parallel group")
    ] = None,
    step_start_s: Annotated[
        float | None, typer.Option(help="assumed: a step's assignment to its first microbatch")
    ] = None,
    microbatch_tokens: Annotated[
        int | None, typer.Option(help="tokens a cell trains per round; default: an execution's mean")
    ] = None,
    weight_bytes: Annotated[float | None, typer.Option(help="bytes a replica all-reduces")] = None,
    link_bytes_per_s: Annotated[float | None, typer.Option(help="assumed: a cell's link")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Write the run's measured execution lengths and call timings as a workload for `gyre sim`;
    what the live services do not measure comes from the options (unset: the schema's defaults)."""
    assumed = Assumed(
        cells=cells,
        async_rollout_cells=async_rollout_cells,
        executions_per_cell=executions_per_cell,
        tokens_per_s_per_cell=tokens_per_s_per_cell,
        step_overhead_s=step_overhead_s,
        rollout_to_training_s=rollout_to_training_s,
        training_to_rollout_s=training_to_rollout_s,
        migrate_s=migrate_s,
        group_setup_s=group_setup_s,
        step_start_s=step_start_s,
        microbatch_tokens=microbatch_tokens,
        weight_bytes=weight_bytes,
        link_bytes_per_s=link_bytes_per_s,
    )
    check_name(name)  # before any service is asked
    check_out_dir(out_dir)
    collected = run(lambda c: collect(c, list(task or [])))
    summary = write(out_dir, name, collected, assumed)
    if as_json:
        print_json(summary)
    else:
        pairs("trace exported", summary.items())


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
