"""`gyre track` and `gyre up --track`: experiment tracking of a run (shell: typer).

`gyre up --track wandb,tensorboard` checks the names and packages before anything starts, then
starts the tracker process beside the stack (JSONL always, plus the named sinks; `none`: no
tracker). `gyre track` writes the rows of what the running stack has trained so far, once, into
a folder of its own (a run that was started without a tracker, or another sink afterwards).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from gyre.bus import Bus, BusConfig
from gyre.settings import KernelSettings, resolve_urls
from gyre_app.cli_tasks import JsonOpt
from gyre_app.output import print_json
from gyre_app.track_config import TrackSettings
from gyre_app.track_sinks import parse_sinks

TRACK_HELP = (
    "trackers besides the JSONL file: tensorboard, wandb, mlflow, trackio (comma-separated); none: no tracker"
)


def up_sinks(track: str | None) -> tuple[str, ...]:
    """What `gyre up --track X` runs: JSONL plus X; without --track, GYRE_TRACK_SINKS (jsonl)."""
    if track is None:
        return parse_sinks(TrackSettings().sinks, field_name="GYRE_TRACK_SINKS")
    named = parse_sinks(track)
    return () if track.strip().lower() == "none" else ("jsonl", *(n for n in named if n != "jsonl"))


def start_for_up(sinks: tuple[str, ...]) -> str:
    """Start the tracker for the stack `gyre up` just started; returns its folder ("" if none)."""
    from gyre_app.stack import REPO_ROOT, kernel_env, load_state
    from gyre_app.track_follow import start_tracker, stop_tracker

    kernel = KernelSettings()
    if not sinks:  # `--track none` on a stack that had a tracker: stop it
        stop_tracker(kernel.state_dir.resolve())
        return ""
    state = load_state(kernel.state_dir.resolve())
    assert state is not None, "gyre up returned without a stack.json"
    env = kernel_env(state.nats_url, state.database_url, kernel.bus_prefix)
    return str(start_tracker(kernel, env, REPO_ROOT, sinks=sinks))


def track(
    out: Annotated[Path, typer.Option(help="folder to write the rows, samples and ATIF files into")],
    sinks: Annotated[
        str, typer.Option(help="comma-separated: jsonl, tensorboard, wandb, mlflow, trackio")
    ] = "jsonl",
    json_: JsonOpt = False,
) -> None:
    """Write a row per step the running stack has trained so far (and its samples, ATIF files)."""
    from gyre_app.track_follow import FollowResult, follow

    names = parse_sinks(sinks, field_name="--sinks")
    kernel = KernelSettings()
    settings = TrackSettings(dir=out)
    state_dir = kernel.state_dir.resolve()
    polls: list[int] = []

    def once(_: list[int]) -> bool:  # one poll reads every stream up to now
        polls.append(1)
        return len(polls) == 1

    async def go() -> FollowResult:
        bus = await Bus.connect(
            BusConfig(url=resolve_urls(kernel).nats_url, prefix=kernel.bus_prefix), name="gyre-track"
        )
        try:
            return await follow(
                bus,
                settings,
                out,
                sinks=names,
                tokenizer_dir=settings.tokenizer_dir or state_dir / "model",
                keep_going=once,
            )
        finally:
            await bus.close()

    result = asyncio.run(go())
    summary = {
        "folder": str(out),
        "steps": result.steps,
        "rows_logged": result.rows_logged,
        "failures": result.failures,
    }
    if json_:
        print_json(summary)
    else:
        print(json.dumps(summary))


def register(app: typer.Typer) -> None:
    app.command()(track)


def stop_for_down(kernel: KernelSettings) -> None:
    from gyre_app.track_follow import stop_tracker

    stop_tracker(kernel.state_dir.resolve())
