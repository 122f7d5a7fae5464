"""LoRA serving and export: the engine merges the published adapter, peft loads the exported one."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from lora_builders import logits, lora_model, lora_trainer, train_steps
from peft import PeftModel
from safetensors.torch import load_file, save_file
from trainer_builders import tiny_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from gyre.errors import InvalidArgument
from gyre_app.cli import main as gyre_main
from gyre_app.export_hf import export_step
from services.engine.torch_engine import TorchEngine
from services.trainer.checkpoint import checkpoint_folder, save_checkpoint
from services.trainer.lora import ADAPTER_CONFIG, ADAPTER_FILE, BaseRef
from services.trainer.weights import WEIGHTS_FILE, PublishedWeights, publish


@dataclass(frozen=True, slots=True, kw_only=True)
class LoraRun:
    model: PreTrainedModel
    base: BaseRef
    root: Path
    weights: PublishedWeights


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> LoraRun:
    """A LoRA run after 3 real steps: its checkpoint of step 3 and its published version 3."""
    root = tmp_path_factory.mktemp("lora")
    model, base = lora_model(root)
    trainer = lora_trainer(model, base=base)
    train_steps(trainer, 3)
    save_checkpoint(
        model, trainer.optimizer, checkpoint_folder(root / "checkpoints", 3), version=3, base=base
    )
    weights = publish(model, root / "weights", version=3, base=base)
    return LoraRun(model=model, base=base, root=root, weights=weights)


def test_the_engine_applies_the_adapter_update_with_the_trainers_logits(
    run: LoraRun,
) -> None:
    model, base, weights = run.model, run.base, run.weights
    engine = TorchEngine(base.folder, engine_id="lora-engine")
    before = logits(engine.model)
    engine.update_weights(version=3, source_uri=weights.source_uri, sha256=weights.sha256)
    assert engine.version == 3
    trained = logits(model)
    assert float((before - trained).abs().max()) > 1e-3  # the adapter changed the policy
    assert float((logits(engine.model) - trained).abs().max()) <= 1e-5
    full = (base.folder / WEIGHTS_FILE).stat().st_size
    assert weights.size_bytes < 0.2 * full  # the update is the adapter alone


def test_an_adapter_for_a_layer_the_engine_lacks_is_refused_and_it_keeps_serving(
    run: LoraRun, tmp_path: Path
) -> None:
    bad = tmp_path / "v4"
    shutil.copytree(run.weights.folder, bad)
    tensors = load_file(str(bad / ADAPTER_FILE))
    renamed = {k.replace("layers.1.", "layers.7."): v for k, v in tensors.items()}
    save_file(renamed, str(bad / ADAPTER_FILE))
    engine = TorchEngine(run.base.folder, engine_id="lora-engine")
    serving = logits(engine.model)
    with pytest.raises(InvalidArgument, match=r"model\.layers\.7"):
        engine.update_weights(version=4, source_uri=bad.as_uri())
    assert engine.version == 0
    assert torch.equal(logits(engine.model), serving)


def test_the_exported_adapter_loads_in_peft_with_the_trainers_logits(run: LoraRun, tmp_path: Path) -> None:
    exported = export_step(run.root / "checkpoints", 3, tmp_path / "adapter", tokenizer_dir=None)
    assert set(exported.files) == {ADAPTER_FILE, ADAPTER_CONFIG}
    assert json.loads((exported.folder / ADAPTER_CONFIG).read_text())["peft_type"] == "LORA"
    base_model = AutoModelForCausalLM.from_pretrained(run.base.folder).float()
    loaded = PeftModel.from_pretrained(base_model, exported.folder)
    assert float((logits(loaded) - logits(run.model)).abs().max()) <= 1e-5


def test_gyre_export_merge_writes_a_full_folder_with_the_trainers_logits(
    run: LoraRun, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "merged"
    argv = ["export", "3", "--out", str(out), "--checkpoints", str(run.root / "checkpoints")]
    assert gyre_main([*argv, "--merge", "--json"]) == 0
    files = set(json.loads(capsys.readouterr().out)["files"])
    assert {"config.json", WEIGHTS_FILE, "generation_config.json"} <= files
    assert ADAPTER_FILE not in files
    loaded = AutoModelForCausalLM.from_pretrained(out).float()
    assert float((logits(loaded) - logits(run.model)).abs().max()) <= 1e-5


def test_merging_a_full_weight_checkpoint_is_refused_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters())
    save_checkpoint(model, optimizer, checkpoint_folder(tmp_path / "checkpoints", 1), version=1)
    capsys.readouterr()  # transformers' progress bar while saving
    argv = ["export", "1", "--out", str(tmp_path / "out"), "--checkpoints", str(tmp_path / "checkpoints")]
    assert gyre_main([*argv, "--merge"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "gyre export: --merge: step 1 is a full-weight checkpoint (not LoRA): nothing to merge"
    assert not (tmp_path / "out").exists()
