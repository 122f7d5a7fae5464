"""LoRA training: only the adapters move, satellites reproduce the gradient, bad settings are refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lora_builders import SPEC, logits, lora_model, lora_trainer, train_steps
from pydantic import ValidationError
from trainer_builders import tree_samples

from gyre.errors import InvalidArgument
from services.trainer.checkpoint import checkpoint_folder, load_checkpoint, save_checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.core_cell import open_core_cell
from services.trainer.lora import ADAPTER_FILE, is_adapter_folder
from services.trainer.microbatch import flat_parameters, parameters_vector, plan_microbatches


def test_a_lora_step_moves_the_adapters_and_leaves_every_base_weight_as_it_was(tmp_path: Path) -> None:
    model, base = lora_model(tmp_path)
    trainer = lora_trainer(model, base=base)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimized = {id(p) for g in trainer.optimizer.param_groups for p in g["params"]}
    assert optimized == {id(p) for n, p in model.named_parameters() if ".lora_" in n}
    train_steps(trainer, 2)  # B starts at 0: A has a gradient from the second step on
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    adapters = {n for n in before if ".lora_" in n}
    assert moved == adapters
    assert trainer.version == 2


def test_satellites_of_a_lora_run_load_the_base_and_reproduce_the_gradient(tmp_path: Path) -> None:
    model, base = lora_model(tmp_path)
    with torch.no_grad():  # B away from 0, so every adapter weight has a gradient
        for name, param in model.named_parameters():
            if ".lora_B" in name:
                param.normal_(std=0.05, generator=torch.Generator().manual_seed(7))
    core = lora_trainer(model, base=base, timeout_s=90).core  # the satellite imports torch under load
    microbatches = plan_microbatches(tree_samples(model, num_executions=4), max_tokens=10_000)
    alone = core.compute_step_gradient(model, microbatches, version=1)
    assert (
        alone.grad_P.numel()
        == parameters_vector(model).numel()
        < 0.2 * sum(p.numel() for p in model.parameters())
    )
    command = [sys.executable, "-m", "services.trainer.satellite", "--cell-id", "cell-1"]
    satellite = subprocess.Popen([*command, "--rendezvous", core.rendezvous_uri])
    try:
        joined = core.compute_step_gradient(
            model, microbatches, version=2, after_microbatch=lambda i: core.request_join("cell-1") and None
        )
        core.request_leave("cell-1").result(timeout=60)
        assert satellite.wait(timeout=60) == 0
    finally:
        if satellite.poll() is None:
            satellite.kill()
    assert joined.max_world_size == 2
    scale = float(alone.grad_P.abs().max())
    assert scale > 0
    assert float((joined.grad_P - alone.grad_P).abs().max()) / scale <= 1e-6


def test_a_lora_checkpoint_resumes_the_same_adapters_and_optimizer(tmp_path: Path) -> None:
    model, base = lora_model(tmp_path)
    trainer = lora_trainer(model, base=base)
    train_steps(trainer, 2)
    folder = checkpoint_folder(tmp_path / "checkpoints", 2)
    save_checkpoint(model, trainer.optimizer, folder, version=2, base=base)
    assert is_adapter_folder(folder) and not (folder / "model.safetensors").exists()
    resumed, optimizer_state, version = load_checkpoint(folder)
    assert version == 2
    assert torch.equal(logits(resumed), logits(model))
    assert len(optimizer_state["state"]) == len(flat_parameters(model))


def test_a_lora_run_publishes_the_adapter_alone_from_its_start(tmp_path: Path) -> None:
    settings = TrainerSettings(state_dir=tmp_path, lora=True, lora_target_modules="v_proj,q_proj")
    cell, initial = open_core_cell(settings, version=0, checkpoint_uri=None)
    assert initial is not None
    assert initial.size_bytes == (initial.folder / ADAPTER_FILE).stat().st_size
    assert is_adapter_folder(initial.folder) and (tmp_path / "base" / "model.safetensors").is_file()
    assert cell.base is not None and cell.base.folder == tmp_path / "base"


def test_a_target_module_the_model_lacks_is_refused_at_start_naming_the_setting(tmp_path: Path) -> None:
    settings = TrainerSettings(state_dir=tmp_path, lora=True, lora_target_modules="q_proj,c_attn")
    with pytest.raises(InvalidArgument) as refused:
        open_core_cell(settings, version=0, checkpoint_uri=None)
    assert refused.value.field == "GYRE_TRAINER_LORA_TARGET_MODULES"
    assert "'c_attn'" in str(refused.value) and "q_proj" in str(refused.value)
    assert not any(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("lora_rank", 0, "GYRE_TRAINER_LORA_RANK"),
        ("lora_rank", -4, "GYRE_TRAINER_LORA_RANK"),
        ("lora_alpha", 0.0, "GYRE_TRAINER_LORA_ALPHA"),
        ("lora_dropout", 1.0, "GYRE_TRAINER_LORA_DROPOUT"),
        ("lora_target_modules", "q_proj,,v_proj", "GYRE_TRAINER_LORA_TARGET_MODULES"),
    ],
)
def test_bad_lora_settings_are_refused_naming_the_setting(field: str, value: object, named: str) -> None:
    with pytest.raises(ValidationError, match=named):
        TrainerSettings.model_validate({"lora": True, field: value})


def test_resuming_with_other_lora_settings_than_the_runs_is_refused(tmp_path: Path) -> None:
    model, base = lora_model(tmp_path)
    trainer = lora_trainer(model, base=base)
    folder = checkpoint_folder(tmp_path / "checkpoints", 1)
    save_checkpoint(model, trainer.optimizer, folder, version=1, base=base)
    settings = TrainerSettings(state_dir=tmp_path, lora=True, lora_rank=SPEC.rank * 2)
    with pytest.raises(InvalidArgument, match="GYRE_TRAINER_LORA"):
        open_core_cell(settings, version=1, checkpoint_uri=folder.as_uri())
