"""Choosing the next token from logits (pure, torch); the parameters live in `sampling_params`.

Logprobs are those of the model itself (log-softmax of the raw logits), before temperature and
top_p: they are what a fresh forward pass of the trainer computes for the same tokens, so the
two can be compared directly. Legend: V vocabulary.
"""

from __future__ import annotations

import torch

from services.engine.sampling_params import Sampling, validate_sampling, validate_token_ids

__all__ = ["Sampling", "choose_token", "validate_sampling", "validate_token_ids"]


def choose_token(logits_V: torch.Tensor, s: Sampling, generator: torch.Generator) -> tuple[int, float]:
    """Pick the next token; returns (token id, its logprob under the model).

    Example:
        logits [0.0, 2.0, 1.0], temperature 0 -> (1, log_softmax(logits)[1] = -0.408)
    """
    logprobs_V = torch.log_softmax(logits_V.float(), dim=-1)
    if s.temperature == 0.0:
        token = int(torch.argmax(logits_V).item())
        return token, float(logprobs_V[token].item())
    probs_V = torch.softmax(logits_V.float() / s.temperature, dim=-1)
    if s.top_p < 1.0:
        sorted_V, order_V = torch.sort(probs_V, descending=True)
        # Keep the smallest head whose mass reaches top_p (the first token is always kept).
        keep_V = (torch.cumsum(sorted_V, dim=-1) - sorted_V) < s.top_p
        probs_V = torch.zeros_like(probs_V).scatter(0, order_V[keep_V], sorted_V[keep_V])
    token = int(torch.multinomial(probs_V, 1, generator=generator).item())
    return token, float(logprobs_V[token].item())
