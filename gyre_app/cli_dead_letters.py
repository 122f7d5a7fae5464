"""`gyre dead-letters list | redrive`: the messages consumers gave up on, and sending them back
(shell: typer; the work is in `gyre_app.dead_letters`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from nats.js import JetStreamContext

from gyre.errors import InvalidArgument, NotFound
from gyre.settings import KernelSettings, resolve_urls
from gyre_app.cli_tasks import JsonOpt
from gyre_app.dead_letters import DeadLetterRow, list_dead_letters, redrive
from gyre_app.dependency_probe import connect_once
from gyre_app.output import console, print_json, table

T = TypeVar("T")

dead_letters_app = typer.Typer(
    help="Messages a consumer gave up on (never handled): list them, send them back.", no_args_is_help=True
)


def on_bus(work: Callable[[JetStreamContext, str], Awaitable[T]]) -> T:
    """Run `work(jetstream, bus prefix)` on the stack's NATS (the environment's, else `gyre up`'s)."""
    kernel = KernelSettings()
    url = resolve_urls(kernel).nats_url

    async def go() -> T:
        nc = await connect_once(url)
        try:
            return await work(nc.jetstream(), kernel.bus_prefix)
        finally:
            await nc.close()

    return asyncio.run(go())


def _show(rows: list[DeadLetterRow]) -> None:
    table(
        "dead letters",
        ("seq", "when", "consumer", "event type", "event id", "delivered", "reason", "subject"),
        (
            (
                r.sequence,
                r.dead_lettered_at,
                r.consumer,
                r.event_type,
                r.event_id,
                r.num_delivered,
                r.reason,
                r.subject,
            )
            for r in rows
        ),
    )


@dead_letters_app.command("list")
def list_command(
    consumer: Annotated[str, typer.Option(help="only the dead letters of this consumer")] = "",
    as_json: JsonOpt = False,
) -> None:
    """List dead letters, oldest first: subject, event type and id, reason, when, and the sequence
    that `gyre dead-letters redrive` takes."""
    rows = [r for r in on_bus(list_dead_letters) if not consumer or r.consumer == consumer]
    if as_json:
        print_json({"dead_letters": [r.as_dict() for r in rows]})
        return
    if not rows:
        console.print("no dead letters" + (f" of consumer {consumer}" if consumer else ""))
        return
    _show(rows)


@dead_letters_app.command("redrive")
def redrive_command(
    sequences: Annotated[
        list[int] | None, typer.Argument(help="sequences from `gyre dead-letters list`", show_default=False)
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="every dead letter (of --consumer, if given)")] = False,
    consumer: Annotated[str, typer.Option(help="only the dead letters of this consumer")] = "",
    as_json: JsonOpt = False,
) -> None:
    """Send dead letters back to their original subjects, to be handled once, and remove them from
    the list (a message that fails again is dead-lettered again)."""
    if bool(sequences) == every:
        raise InvalidArgument(
            "SEQUENCES / --all", "give the sequences to redrive or --all, not both or neither"
        )

    async def go(js: JetStreamContext, prefix: str) -> list[dict[str, Any]]:
        rows = [r for r in await list_dead_letters(js, prefix) if not consumer or r.consumer == consumer]
        if sequences:
            by_sequence = {r.sequence: r for r in rows}
            missing = sorted(set(sequences) - set(by_sequence))
            if missing:
                raise NotFound(
                    f"SEQUENCES: no dead letter with sequence {', '.join(map(str, missing))}"
                    + (f" of consumer {consumer}" if consumer else "")
                    + " (see `gyre dead-letters list`)"
                )
            rows = [by_sequence[s] for s in sorted(set(sequences))]
        return await redrive(js, prefix, rows)

    done = on_bus(go)
    if as_json:
        print_json({"redriven": done})
        return
    for row in done:
        sent = "sent back" if row["published"] else "already sent back (duplicate)"
        console.print(f"{row['sequence']}: {row['event_type']} {row['event_id']} -> {row['subject']}: {sent}")
    if not done:
        console.print("no dead letters to redrive")


def register(app: typer.Typer) -> None:
    app.add_typer(dead_letters_app, name="dead-letters")
