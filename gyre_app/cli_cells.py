"""`gyre mode [MODE]` and `gyre cells [list | switch CELL ROLE]`: modes and role switches (shell)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import typer

from gyre.errors import InvalidArgument
from gyre.scheduler.v1 import scheduler_pb2
from gyre_app.cli_tasks import JsonOpt, run
from gyre_app.client import GyreClient
from gyre_app.client.addresses import ServiceAddresses
from gyre_app.output import message_dict, pairs, print_json, table

MODES = ("colocate", "async", "gyre", "burst")
ROLES = ("rollout", "training")
SWITCH_TIMEOUT_S = 300.0
"""A switch drains calls, frees or loads weights and joins or leaves a step: it may take minutes."""
cells_app = typer.Typer(help="Cells and their roles.", no_args_is_help=False, invoke_without_command=True)


def _mode_name(value: int) -> str:
    return scheduler_pb2.SchedulingMode.Name(value).removeprefix("SCHEDULING_MODE_").lower()  # type: ignore[arg-type]


def _role_name(value: int) -> str:
    return scheduler_pb2.CellRole.Name(value).removeprefix("CELL_ROLE_").lower()  # type: ignore[arg-type]


def choice(field: str, value: str, allowed: tuple[str, ...]) -> str:
    """`value` lower-cased when it is one of `allowed`; else an InvalidArgument naming `field`.

    Example:
        choice("mode", "ASYNC", MODES) -> "async";  choice("mode", "fast", MODES) -> InvalidArgument
    """
    if value.lower() not in allowed:
        raise InvalidArgument(field, f"must be one of {', '.join(allowed)}, got {value!r}")
    return value.lower()


def mode(
    name: Annotated[
        str | None, typer.Argument(help=f"the mode to set: {', '.join(MODES)}; none: show the mode")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Show the scheduling mode, or set it (while a step runs it takes effect at the step's end)."""
    wanted = choice("mode", name, MODES) if name is not None else None

    async def go(client: GyreClient) -> dict[str, Any]:
        if wanted is None:
            return {"mode": _mode_name((await client.cells()).mode)}  # type: ignore[attr-defined]
        answer = await client.set_mode(wanted)
        now = _mode_name((await client.cells()).mode)  # type: ignore[attr-defined]
        return {
            "previous_mode": _mode_name(answer.previous_mode),
            "mode": now,
            "pending": now != wanted,  # asked during a step: it waits for the step's end
        }

    out = run(go)
    if as_json:
        print_json(out)
        return
    if wanted is not None and out["pending"]:
        out["note"] = f"{wanted} takes effect when the running step completes"
    pairs("mode", out.items())


@cells_app.callback()
def cells(ctx: typer.Context, as_json: JsonOpt = False) -> None:
    """The cells, their roles and the mode (`gyre cells switch CELL ROLE` moves a satellite)."""
    if ctx.invoked_subcommand is not None:
        return
    answer: Any = run(lambda c: c.cells())
    if as_json:
        print_json(message_dict(answer))
        return
    table(
        f"cells (mode {_mode_name(answer.mode)})",
        ("cell_id", "role", "core", "slots"),
        ((c.cell_id, _role_name(c.role), c.core, c.slots) for c in answer.cells),
    )


@cells_app.command()
def switch(
    cell_id: Annotated[str, typer.Argument(help="the satellite, e.g. cell-1 (not the core cell)")],
    role: Annotated[str, typer.Argument(help="rollout or training")],
    as_json: JsonOpt = False,
) -> None:
    """Switch one satellite's role now; returns when the switch ended (in either role)."""
    to = choice("role", role, ROLES)

    async def go() -> Any:
        async with GyreClient(ServiceAddresses.resolve(), timeout_s=SWITCH_TIMEOUT_S) as client:
            return await client.switch_cell(cell_id, to)

    answer: Any = asyncio.run(go())
    sw = answer.switch
    if as_json:
        print_json(message_dict(answer))
        return
    pairs(
        f"switch of {cell_id}",
        (
            ("ok", sw.ok),
            ("role now", _role_name(sw.to_role)),
            ("took_s", round(sw.total_s, 3)),
            ("error", sw.error or "-"),
        ),
    )
    if not sw.ok:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(mode)
    app.add_typer(cells_app, name="cells")
