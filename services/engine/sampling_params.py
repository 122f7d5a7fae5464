"""Sampling parameters and their validation (pure, no torch: the emulated engine uses them too)."""

from __future__ import annotations

from dataclasses import dataclass

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
