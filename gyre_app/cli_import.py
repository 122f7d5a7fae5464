"""`gyre tasks import SOURCE --out DIR`: public datasets into Gyre task folders (shell).

Prints `{"imported": N, "refused": [{"id", "field", "why"}]}`; the instances that can be
imported are written even when others are refused. Exit 0 when at least one task was written,
2 when none could be (nothing is written then), 1 for a bad SOURCE, --format or --out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gyre_app.output import JSON_HELP, console, print_json, table


def tasks_import(
    source: Annotated[
        Path, typer.Argument(help="a JSON-lines (or JSON list) file of rows, or a folder of Harbor tasks")
    ],
    out: Annotated[Path, typer.Option(help="a new or empty folder for the task folders")],
    fmt: Annotated[
        str,
        typer.Option(
            "--format", help="auto, harbor, swebench (also swegym, swesmith: the image rule to use) or r2e"
        ),
    ] = "auto",
    as_json: Annotated[bool, typer.Option("--json", help=JSON_HELP)] = False,
) -> None:
    """Import SWE-bench-family or R2E-Gym rows, or Harbor task folders, one task folder each."""
    from services.evaluator.imports.imported import ImportedTask, Refusal
    from services.evaluator.imports.sources import import_source
    from services.evaluator.imports.writer import dedupe, write_tasks

    results = dedupe(import_source(source, fmt))
    tasks = [r for r in results if isinstance(r, ImportedTask)]
    refused = [r.as_dict() for r in results if isinstance(r, Refusal)]
    if tasks:
        write_tasks(out, tasks, source=str(source.resolve()))
    if as_json:
        print_json({"imported": len(tasks), "refused": refused})
    else:
        if refused:
            table("refused", ("id", "field", "why"), ((r["id"], r["field"], r["why"]) for r in refused))
        console.print(f"imported {len(tasks)} task(s) into {out}" if tasks else "imported nothing")
    if not tasks:
        raise typer.Exit(2)
