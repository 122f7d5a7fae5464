"""The policy model: loading it, and logprobs of sample tokens, flat or tree-packed (torch).

`flat_logprobs` runs every sample as its own row of a right-padded batch (the baseline);
`packed_logprobs` runs one packed tree per call, its attention following the tree in chunks with
per-node position ids and no N x N mask (see `packing`, `tree_forward`). Both return the logprob
of tokens 1..T-1 of every sample in sample order (the K order of `loss`), so the same loss applies to either.

Legend: B rows, T padded length, N packed nodes, V vocabulary, K predicted tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, Qwen2Config

from services.trainer.packing import pack_sequences
from services.trainer.tree_forward import TreePackingConfig, tree_logprobs

# SDPA reads a boolean mask as "may attend"; eager attention would add it as 0/1 to the scores.
ATTENTION = "sdpa"


def tiny_config(*, vocab_size: int = 512, hidden_size: int = 64, num_layers: int = 2) -> Qwen2Config:
    """A Qwen2-architecture configuration small enough for a CPU thread (no hub download)."""
    return Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
    )


def build_model(config: Qwen2Config, *, seed: int) -> PreTrainedModel:
    """A freshly initialised model (SDPA attention, which takes a boolean 4-D mask as given)."""
    torch.manual_seed(seed)
    model: PreTrainedModel = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
        config, attn_implementation=ATTENTION
    )
    return model.float()  # type: ignore[no-any-return,no-untyped-call]


def load_model(folder: Path) -> PreTrainedModel:
    """Load `config.json` + `model.safetensors` from a folder written by `weights.publish`."""
    config = AutoConfig.from_pretrained(folder)
    model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
        folder, config=config, attn_implementation=ATTENTION
    )
    return model.float()  # type: ignore[no-any-return,no-untyped-call]


def _gather_logprobs(logits_KV: torch.Tensor, targets_K: torch.Tensor) -> torch.Tensor:
    logits_KV = logits_KV.float()
    return logits_KV.gather(1, targets_K[:, None])[:, 0] - torch.logsumexp(logits_KV, dim=-1)


def flat_logprobs(model: PreTrainedModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each sequence as its own right-padded row: the computation tree packing must reproduce."""
    t_max = max(len(s) for s in sequences)
    ids_BT = torch.zeros(len(sequences), t_max, dtype=torch.long)
    mask_BT = torch.zeros(len(sequences), t_max, dtype=torch.long)
    for b, seq in enumerate(sequences):
        ids_BT[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask_BT[b, : len(seq)] = 1
    logits_BTV = model(input_ids=ids_BT.to(model.device), attention_mask=mask_BT.to(model.device)).logits
    rows = torch.cat([torch.full((len(s) - 1,), b, dtype=torch.long) for b, s in enumerate(sequences)])
    cols = torch.cat([torch.arange(len(s) - 1) for s in sequences])
    targets_K = torch.cat([torch.tensor(s[1:], dtype=torch.long) for s in sequences])
    return _gather_logprobs(
        logits_BTV[rows.to(model.device), cols.to(model.device)], targets_K.to(model.device)
    )


def separate_logprobs(model: PreTrainedModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """Each sequence run on its own, no padding and no mask (causal SDPA): the unpacked reference.

    Memory stays linear in a sequence's length, so long trajectories fit where a padded batch would not.
    """
    pieces = []
    for seq in sequences:
        ids_1T = torch.tensor(seq, dtype=torch.long, device=model.device)[None]
        logits_1TV = model(input_ids=ids_1T).logits
        pieces.append(_gather_logprobs(logits_1TV[0, :-1], ids_1T[0, 1:]))
    return torch.cat(pieces)


def packed_logprobs(
    model: PreTrainedModel,
    sequences: Sequence[Sequence[int]],
    config: TreePackingConfig | None = None,
) -> torch.Tensor:
    """All sequences in one packed tree: each shared prefix is computed once."""
    return tree_logprobs(model, pack_sequences(sequences), config or TreePackingConfig())
