"""`gyre export`: a trainer checkpoint as a clean Hugging Face model folder (shell: reads and writes files).

The trainer's checkpoint `step-<version>` holds the model folder (`config.json`,
`model.safetensors`, `generation_config.json`) beside its own `optimizer.pt` and `meta.json`; the
tokenizer lives with the initial weights (`gyre model init`), not in the checkpoint. The export
copies the model files byte for byte (so the exported weights are exactly the trainer's), adds
the tokenizer with its chat template, makes sure a `generation_config.json` is there, and leaves
the optimizer state and Gyre's bookkeeping behind. It is written under a temporary name and
renamed, so a failed export leaves nothing half-written.

A LoRA run's checkpoint holds the adapter alone: it is exported as a PEFT adapter folder
(`adapter_model.safetensors` + `adapter_config.json`, copied byte for byte, with the tokenizer),
which `peft` loads onto the base; with `merge` the adapter is merged into the base instead and
the export is a full Hugging Face folder like any other (the merge is the engines' own,
`services.engine.adapter_merge`).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from gyre.errors import InvalidArgument, NotFound

MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json")
"""What a checkpoint holds that a Hugging Face loader reads; sharded weights are matched apart."""
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_config.json")
"""A LoRA checkpoint's PEFT files."""
LEFT_BEHIND = ("optimizer.pt", "meta.json", "gyre_base.json")
"""Trainer-only state an exported model never carries."""
CHAT_TEMPLATE_FILE = "chat_template.jinja"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportedModel:
    step: int
    folder: Path
    files: tuple[str, ...]
    size_bytes: int


def checkpoint_steps(checkpoints_root: Path) -> list[int]:
    """The steps with a complete checkpoint under `checkpoints_root`, oldest first.

    Example: step-00000002, step-00000003, step-00000004.staging -> [2, 3]
    """
    if not checkpoints_root.is_dir():
        return []
    steps = []
    for folder in checkpoints_root.glob("step-*"):
        number = folder.name.removeprefix("step-")
        model_files = (folder / "config.json").is_file() or (folder / ADAPTER_FILES[1]).is_file()
        if folder.is_dir() and number.isdigit() and model_files:
            steps.append(int(number))
    return sorted(steps)


def find_checkpoint(checkpoints_root: Path, step: int) -> Path:
    """The checkpoint folder of `step`; `NotFound` naming the steps that do exist."""
    from services.trainer.checkpoint import checkpoint_folder

    folder = checkpoint_folder(checkpoints_root, step)
    if step in checkpoint_steps(checkpoints_root):
        return folder
    known = checkpoint_steps(checkpoints_root)
    have = ", ".join(map(str, known)) if known else f"none (no checkpoint under {checkpoints_root})"
    raise NotFound(f"STEP: no checkpoint of step {step}; steps with a checkpoint: {have}")


def export_step(
    checkpoints_root: Path, step: int, out: Path, *, tokenizer_dir: Path | None, merge: bool = False
) -> ExportedModel:
    """Write the checkpoint of `step` into `out` (absent or empty) as a Hugging Face model folder,
    or as a PEFT adapter folder when the run trained LoRA adapters (`merge`: merged into the base).

    `tokenizer_dir` is the folder of the initial weights, where the tokenizer is; `None` exports
    the weights and configs alone (a model trained from `tiny_config` has no tokenizer).
    """
    if step < 0:
        raise InvalidArgument("STEP", f"a step number, 0 or more, got {step}")
    source = find_checkpoint(checkpoints_root, step)
    adapter = (source / ADAPTER_FILES[1]).is_file()
    if merge and not adapter:
        raise InvalidArgument(
            "--merge", f"step {step} is a full-weight checkpoint (not LoRA): nothing to merge"
        )
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InvalidArgument("--out", f"an absent or empty folder (nothing is overwritten), got {out}")
    if tokenizer_dir is not None and not (tokenizer_dir / "tokenizer_config.json").is_file():
        raise InvalidArgument("--tokenizer", f"a folder with tokenizer_config.json, got {tokenizer_dir}")
    staging = out.with_name(out.name + ".export-tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        if merge:
            _write_merged(source, staging)
        for path in sorted(source.iterdir()):
            shard = path.name.startswith("model-") and path.suffix == ".safetensors"
            if not merge and (path.name in MODEL_FILES + ADAPTER_FILES or shard):
                shutil.copy2(path, staging / path.name)
        if tokenizer_dir is not None:
            _write_tokenizer(tokenizer_dir, staging)
        if (merge or not adapter) and not (staging / "generation_config.json").is_file():
            _write_generation_config(staging, tokenizer_dir)
        if out.exists():
            out.rmdir()  # empty, checked above
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    files = tuple(sorted(p.name for p in out.iterdir()))
    return ExportedModel(
        step=step, folder=out, files=files, size_bytes=sum((out / f).stat().st_size for f in files)
    )


def _write_merged(source: Path, out: Path) -> None:
    """The base named by a LoRA checkpoint with its adapter merged in, saved as transformers does."""
    from safetensors.torch import load_file

    from services.engine.adapter_merge import merged_state
    from services.trainer.lora import ADAPTER_CONFIG, ADAPTER_FILE, BaseRef
    from services.trainer.policy import load_model

    base = BaseRef.read(source)
    if not (base.folder / "config.json").is_file():
        raise NotFound(f"STEP: the base weights of this LoRA checkpoint are not at {base.folder}")
    model = load_model(base.folder)
    config = json.loads((source / ADAPTER_CONFIG).read_text())
    merged = merged_state(model.state_dict(), load_file(str(source / ADAPTER_FILE)), config)
    model.load_state_dict(merged, strict=False)
    model.save_pretrained(out, safe_serialization=True)


def _write_tokenizer(tokenizer_dir: Path, out: Path) -> None:
    """The tokenizer as transformers saves it, with the chat template in its own file too (vLLM
    and llama.cpp read `chat_template.jinja`; older transformers read `tokenizer_config.json`)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)  # type: ignore[no-untyped-call]
    tokenizer.save_pretrained(out)
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and not (out / CHAT_TEMPLATE_FILE).is_file():
        (out / CHAT_TEMPLATE_FILE).write_text(template)


def _write_generation_config(out: Path, tokenizer_dir: Path | None) -> None:
    """A generation config from the model's own ids (a checkpoint of a model that had none)."""
    config = json.loads((out / "config.json").read_text())
    generation = {
        key: config[key]
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if config.get(key) is not None
    }
    if tokenizer_dir is not None and (tokenizer_dir / "generation_config.json").is_file():
        generation = json.loads((tokenizer_dir / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
