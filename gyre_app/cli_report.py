"""`gyre report`: an HTML report of a training run with pictures (shell: typer)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from gyre.bus import Bus, BusConfig
from gyre.settings import KernelSettings, resolve_urls
from gyre_app.cli_tasks import JsonOpt
from gyre_app.client import GyreClient, ServiceAddresses
from gyre_app.output import console, print_json
from gyre_app.report_model import Report


def build_report(*, run: str = "", execution: str = "") -> Report:
    """Gather a run's report from the running services and the bus (`NotFound` for an unknown run)."""
    from gyre_app.report_gather import gather  # here: it brings numpy, ~0.25 s of every `gyre` start

    kernel = KernelSettings()
    nats_url = resolve_urls(kernel).nats_url

    async def go() -> Report:
        bus = await Bus.connect(BusConfig(url=nats_url, prefix=kernel.bus_prefix), name="gyre-report")
        try:
            async with GyreClient(ServiceAddresses.resolve()) as client:
                return await gather(client, bus, run=run, execution_id=execution)
        finally:
            await bus.close()

    return asyncio.run(go())


def report(
    out: Annotated[Path, typer.Option(help="the HTML file to write (pictures embedded)")] = Path(
        "gyre-report.html"
    ),
    run: Annotated[str, typer.Option(help="only the steps that trained tasks labelled run=RUN")] = "",
    execution: Annotated[
        str, typer.Option(help="the execution whose tree to draw (default: the best of the last step)")
    ] = "",
    as_json: JsonOpt = False,
) -> None:
    """Write an HTML report of a run: reward per step, held-out score, staleness, partial credit per
    check, one execution's tree and, where the scheduler has cells, the cell-role timeline."""
    # Here, not at the top: matplotlib costs every other `gyre` command ~0.4 s of start-up.
    from gyre_app.report_render import write_report

    data = build_report(run=run, execution=execution)
    path = write_report(data, out)
    summary = {**data.summary(), "report": str(path), "not_drawn": dict(data.notes)}
    if as_json:
        print_json(summary)
    else:
        console.print(f"report written: {path}")
        for part, why in data.notes.items():
            console.print(f"  {part}: {why}")


def register(app: typer.Typer) -> None:
    app.command()(report)
