"""Sampling parameters, their validation, and choosing the next token from logits (pure, torch).

Logprobs are those of the model itself (log-softmax of the raw logits), before temperature and
top_p: they are what a fresh forward pass of the trainer computes for the same tokens, so the
two can be compared directly. Legend: V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gyre.errors import InvalidArgument


@dataclass(frozen=True, slots=True, kw_only=True)
class Sampling:
    """How to sample one generation; `max_tokens` counts across pauses and engines."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 16
    stop_ids: frozenset[int] = frozenset()
    seed: int | None = None


def validate_sampling(s: Sampling, *, vocab_size: int, field: str = "sampling") -> None:
    if not s.temperature >= 0.0:
        raise InvalidArgument(f"{field}.temperature", f"must be >= 0 (0 is greedy), got {s.temperature}")
    if not 0.0 < s.top_p <= 1.0:
        raise InvalidArgument(f"{field}.top_p", f"must be in (0, 1], got {s.top_p}")
    if s.max_tokens <= 0:
        raise InvalidArgument(f"{field}.max_tokens", f"must be >= 1, got {s.max_tokens}")
    bad = sorted(i for i in s.stop_ids if not 0 <= i < vocab_size)
    if bad:
        raise InvalidArgument(
            f"{field}.stop_ids", f"ids {bad[:5]} are outside the vocabulary [0, {vocab_size})"
        )


def validate_token_ids(ids: list[int], *, vocab_size: int, field: str) -> None:
    for i, t in enumerate(ids):
        if not 0 <= t < vocab_size:
            raise InvalidArgument(
                f"{field}[{i}]", f"token id {t} is outside the vocabulary [0, {vocab_size})"
            )


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
