"""`gyre export`: a trainer checkpoint as a Hugging Face model folder (shell: typer)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gyre.settings import KernelSettings
from gyre_app.cli_tasks import JsonOpt
from gyre_app.output import print_json


def export(
    step: Annotated[
        int, typer.Argument(help="the training step (policy version) whose checkpoint to export")
    ],
    out: Annotated[Path, typer.Option(help="folder to write (absent or empty)")],
    checkpoints: Annotated[
        Path | None,
        typer.Option(
            help="the trainer's checkpoint folder (default: <state>/trainer/checkpoints of `gyre up`)"
        ),
    ] = None,
    tokenizer: Annotated[
        Path | None,
        typer.Option(help="folder of the tokenizer (default: the stack's initial model, <state>/model)"),
    ] = None,
    merge: Annotated[
        bool,
        typer.Option(
            "--merge", help="a LoRA run: merge the adapter into the base and write a full model folder"
        ),
    ] = False,
    json_: JsonOpt = False,
) -> None:
    """Write a step's checkpoint as a Hugging Face folder: weights, configs, tokenizer; no optimizer.

    A LoRA run's step is written as a PEFT adapter (adapter_model.safetensors, adapter_config.json)
    that `peft` loads onto the base, or with --merge as a full model folder."""
    from gyre_app.export_hf import export_step  # here: it brings transformers only when named

    state_dir = KernelSettings().state_dir.resolve()
    default_tokenizer = state_dir / "model"
    tokenizer_dir = tokenizer or (
        default_tokenizer if (default_tokenizer / "tokenizer_config.json").is_file() else None
    )
    exported = export_step(
        checkpoints or state_dir / "trainer" / "checkpoints",
        step,
        out,
        tokenizer_dir=tokenizer_dir,
        merge=merge,
    )
    if json_:
        print_json(
            {
                "step": exported.step,
                "folder": str(exported.folder),
                "files": list(exported.files),
                "size_bytes": exported.size_bytes,
            }
        )
    else:
        print(f"exported step {exported.step} to {exported.folder}: {', '.join(exported.files)}")


def register(app: typer.Typer) -> None:
    app.command()(export)
