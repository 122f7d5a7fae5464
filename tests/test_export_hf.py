"""`gyre export`: a trainer checkpoint loaded by plain transformers gives the trainer's logits."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from gyre.errors import InvalidArgument, NotFound
from gyre_app.cli import main as gyre_main
from gyre_app.export_hf import checkpoint_steps, export_step
from services.engine.model_init import init_model
from services.trainer.checkpoint import checkpoint_folder, save_checkpoint
from services.trainer.policy import load_model

PROMPT_IDS = [[3, 17, 42, 99, 5, 61, 8], [7, 7, 120, 33, 2, 9, 200]]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreTrainedModel, Path, Path]:
    """A tiny model after two real optimizer steps, checkpointed as the trainer does at steps 1 and 2."""
    root = tmp_path_factory.mktemp("export")
    model_dir = init_model(root / "model", seed=3, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2)
    model = load_model(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    checkpoints = root / "checkpoints"
    ids = torch.tensor(PROMPT_IDS)
    for version in (1, 2):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        save_checkpoint(model, optimizer, checkpoint_folder(checkpoints, version), version=version)
    return model, checkpoints, model_dir


def test_exported_model_loads_in_transformers_with_the_trainers_logits(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path
) -> None:
    model, checkpoints, model_dir = trained
    exported = export_step(checkpoints, 2, tmp_path / "hf", tokenizer_dir=model_dir)
    loaded = AutoModelForCausalLM.from_pretrained(exported.folder).float().eval()
    ids = torch.tensor(PROMPT_IDS)
    with torch.no_grad():
        diff = (loaded(input_ids=ids).logits - model.eval()(input_ids=ids).logits).abs().max().item()
    assert diff <= 1e-5


def test_export_holds_tokenizer_chat_template_and_generation_config_but_no_optimizer(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path
) -> None:
    _, checkpoints, model_dir = trained
    exported = export_step(checkpoints, 1, tmp_path / "hf", tokenizer_dir=model_dir)
    assert "optimizer.pt" not in exported.files and "meta.json" not in exported.files
    assert {"config.json", "model.safetensors", "generation_config.json", "chat_template.jinja"} <= set(
        exported.files
    )
    tokenizer = AutoTokenizer.from_pretrained(exported.folder)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "hi" in rendered
    eos = json.loads((exported.folder / "generation_config.json").read_text())["eos_token_id"]
    assert eos == [tokenizer.convert_tokens_to_ids("<|im_end|>")] or eos == tokenizer.convert_tokens_to_ids(
        "<|im_end|>"
    )


def test_a_step_without_checkpoint_is_refused_naming_the_steps_that_exist(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path
) -> None:
    _, checkpoints, model_dir = trained
    with pytest.raises(NotFound, match=r"no checkpoint of step 7; steps with a checkpoint: 1, 2"):
        export_step(checkpoints, 7, tmp_path / "hf", tokenizer_dir=model_dir)
    assert not (tmp_path / "hf").exists()


def test_a_non_empty_out_folder_is_refused_and_left_as_it_was(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path
) -> None:
    _, checkpoints, model_dir = trained
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep me")
    with pytest.raises(InvalidArgument, match="--out: an absent or empty folder"):
        export_step(checkpoints, 1, tmp_path / "hf", tokenizer_dir=model_dir)
    assert [p.name for p in (tmp_path / "hf").iterdir()] == ["mine.txt"]


def test_checkpoint_steps_ignore_a_half_written_checkpoint(tmp_path: Path) -> None:
    for name in ("step-00000002", "step-00000003", "step-00000004.staging"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    assert checkpoint_steps(tmp_path) == [2, 3]


def test_gyre_export_command_refuses_an_unknown_step_on_one_line(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, checkpoints, model_dir = trained
    argv = ["export", "9", "--out", str(tmp_path / "hf"), "--checkpoints", str(checkpoints)]
    assert gyre_main([*argv, "--tokenizer", str(model_dir)]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "gyre export: STEP: no checkpoint of step 9; steps with a checkpoint: 1, 2"


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
    reason="needs a CUDA device and the vllm extra",
)
def test_exported_model_loads_in_vllm_and_scores_like_the_trainer(
    trained: tuple[PreTrainedModel, Path, Path], tmp_path: Path
) -> None:
    """vLLM serves the exported folder as it is; its greedy tokens are the trainer model's argmax."""
    from vllm import LLM, SamplingParams

    model, checkpoints, model_dir = trained
    exported = export_step(checkpoints, 2, tmp_path / "hf", tokenizer_dir=model_dir)
    llm = LLM(model=str(exported.folder), dtype="float32", enforce_eager=True, gpu_memory_utilization=0.2)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in PROMPT_IDS], params)
    with torch.no_grad():
        expected = model.eval()(input_ids=torch.tensor(PROMPT_IDS)).logits[:, -1].argmax(-1).tolist()
    assert [o.outputs[0].token_ids[0] for o in outputs] == expected
