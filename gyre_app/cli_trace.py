"""`gyre trace export`: a live run's executions and calls as a `gyre sim` workload trace (shell)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from gyre.errors import InvalidArgument, NotFound
from gyre.runner.v1 import runner_pb2
from gyre_app.cli_tasks import JsonOpt, run
from gyre_app.client import GyreClient
from gyre_app.output import pairs, print_json
from gyre_app.trace_export import HEADER, Assumed, ExecutionTrace, Measured, workload

trace_app = typer.Typer(help="Workload traces for `gyre sim`, measured on a live run.", no_args_is_help=True)
DEFAULTS = Assumed()
ENDED = (
    runner_pb2.EXECUTION_STATE_FINISHED,
    runner_pb2.EXECUTION_STATE_TIMED_OUT,
    runner_pb2.EXECUTION_STATE_FAILED,
    runner_pb2.EXECUTION_STATE_CANCELLED,
)


async def _execution(client: GyreClient, task_id: str, execution_id: str) -> ExecutionTrace | str:
    """The execution's trace, or why it has none (still running, or no model call)."""
    e = await client.runner_execution(execution_id)
    if e.state not in ENDED or not (e.HasField("started_at") and e.HasField("ended_at")):
        return "not ended"
    try:
        tree = await client.execution_tree(execution_id)
    except NotFound:
        return "no model call"
    latency, output = [], []
    for c in tree.calls:
        call = (await client.call(c.call_id)).call
        if call.HasField("started_at") and call.HasField("finished_at"):
            latency.append((call.finished_at.ToDatetime() - call.started_at.ToDatetime()).total_seconds())
        output.append(c.num_output_tokens)
    return ExecutionTrace(
        execution_id=execution_id,
        task_id=task_id,
        duration_s=max(1e-3, (e.ended_at.ToDatetime() - e.started_at.ToDatetime()).total_seconds()),
        tokens=sum(t.num_tokens for t in tree.trajectories if t.selected),
        timed_out=e.state == runner_pb2.EXECUTION_STATE_TIMED_OUT,
        num_calls=len(tree.calls),
        call_latency_s=latency,
        call_output_tokens=output,
    )


async def _collect(
    client: GyreClient, task_ids: list[str]
) -> tuple[list[ExecutionTrace], dict[str, int], Measured]:
    per_step: list[int] = []
    if not task_ids:
        latest = (await client.trainer_status()).version.steps
        if latest == 0:
            raise NotFound("no step trained yet: name the tasks to export with --task")
        for v in range(1, latest + 1):
            step = await client.step(v)
            per_step.append(len(step.task_ids))
            task_ids += list(step.task_ids)
    traces: list[ExecutionTrace] = []
    skipped: dict[str, int] = {}
    sizes, timeouts = [], []
    for task_id in task_ids:
        task = await client.get_task(task_id)
        sizes.append(task.spec.group_size)
        timeouts.append(task.spec.timeout_s)
        for ref in task.executions:
            got = await _execution(client, task_id, ref.execution_id)
            if isinstance(got, str):
                skipped[got] = skipped.get(got, 0) + 1
            else:
                traces.append(got)
    staleness = (await client.trainer_status()).max_staleness_steps
    measured = Measured(
        group_sizes=sizes, groups_per_step=per_step, max_staleness=staleness, timeouts_s=timeouts
    )
    return traces, skipped, measured


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
    as_json: JsonOpt = False,
) -> None:
    """Write the run's measured execution lengths and call timings as a workload for `gyre sim`."""
    if not name.replace("-", "").replace("_", "").isalnum():
        raise InvalidArgument("--name", f"must be letters, digits, - and _, got {name!r}")
    traces, skipped, measured = run(lambda c: _collect(c, list(task or [])))
    if not traces:
        raise NotFound(f"no ended execution with model calls to export (skipped: {skipped or 'none'})")
    assumed = Assumed(
        cells=cells,
        async_rollout_cells=async_rollout_cells,
        executions_per_cell=executions_per_cell,
        tokens_per_s_per_cell=tokens_per_s_per_cell,
        step_overhead_s=step_overhead_s,
    )
    data = workload(name, f"{name}.jsonl", measured=measured, assumed=assumed)
    from services.scheduler.sim.workload import parse_workload

    out_dir.mkdir(parents=True, exist_ok=True)
    trace_path, workload_path = out_dir / f"{name}.jsonl", out_dir / f"{name}.yaml"
    trace_path.write_text("".join(json.dumps(t.record()) + "\n" for t in traces))
    parse_workload(data, base_dir=out_dir)  # refuse to leave a workload `gyre sim` would not read
    workload_path.write_text(HEADER + yaml.safe_dump(data, sort_keys=False))
    summary: dict[str, Any] = {
        "workload": str(workload_path),
        "trace": str(trace_path),
        "num_executions": len(traces),
        "skipped": skipped,
        "num_calls": sum(t.num_calls for t in traces),
    }
    if as_json:
        print_json(summary)
    else:
        pairs("trace exported", summary.items())


def register(app: typer.Typer) -> None:
    app.add_typer(trace_app, name="trace")
