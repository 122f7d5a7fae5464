"""`gyre images base`: build the offline Python base image that task images start FROM (shell)."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from gyre.errors import GyreError
from gyre_app.cli_tasks import JsonOpt
from gyre_app.images import DEFAULT_BASE, MIRROR, build_base, image_exists
from gyre_app.output import console, print_json

images_app = typer.Typer(
    help="OCI images for container tasks, built without a registry.", no_args_is_help=True
)


@images_app.command("base")
def base(
    tag: Annotated[
        str, typer.Option("--tag", help="image name to build (skipped when it exists)")
    ] = DEFAULT_BASE,
    mirror: Annotated[str, typer.Option("--mirror", help="Debian package mirror")] = MIRROR,
    json_out: JsonOpt = False,
) -> None:
    """A Debian root with python3, pytest, git and patch (mmdebstrap), imported into podman."""
    started = time.monotonic()
    try:
        built = build_base(tag, mirror=mirror)
    except GyreError as exc:
        console.print(f"gyre images base: {exc}")
        raise typer.Exit(2) from exc
    result = {
        "tag": tag,
        "built": built,
        "present": image_exists(tag),
        "duration_s": round(time.monotonic() - started, 1),
    }
    if json_out:
        print_json(result)
    else:
        console.print(f"{tag}: {'built' if built else 'already present'} in {result['duration_s']} s")


def register(app: typer.Typer) -> None:
    app.add_typer(images_app, name="images")
