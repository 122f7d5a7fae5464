"""One generation's state inside an engine, and the token pieces engines emit (pure).

A sequence's tokens are its prompt followed by its output. Its KV cache covers the first
`num_cached` of them; while it runs, every token but the last is cached (the last one is the next
decode step's input), so a sequence paused here or imported from elsewhere resumes with a decode
step and no prefill.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.engine.sampling_params import Sampling

if TYPE_CHECKING:  # tensors only in the torch engine; the port and the emulated engine import no torch
    from services.engine.kv import LayerKV


class Finish(enum.Enum):
    """Why a generation stream ended (the proto's FinishReason)."""

    STOP = "stop"
    LENGTH = "length"
    CONTEXT_LENGTH = "context_length"
    PAUSED = "paused"
    CANCELLED = "cancelled"


class Status(enum.Enum):
    WAITING = "waiting"
    """Admitted; its uncached tokens still need a prefill (a chunk per engine step, so a long
    prompt waits here over several steps with the chunks done so far in `kv`)."""
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True, kw_only=True)
class Emission:
    """Tokens one generation produced in one step, and whether its stream ends here."""

    request_id: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    policy_versions: tuple[int, ...] = ()
    finish: Finish | None = None


@dataclass(slots=True, kw_only=True)
class Sequence:
    request_id: str
    execution_id: str
    prompt_ids: list[int]
    sampling: Sampling
    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    status: Status = Status.WAITING
    finish: Finish | None = None
    kv: list[LayerKV] | None = None
    """KV of `token_ids[:num_cached]` while not in the decode batch; None when nothing is cached."""
    num_cached: int = 0
    num_cached_prompt_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache (or an import)."""
    stream_start: int = 0
    """Output index where the current stream began: 0 for Generate, the pause point for Resume."""

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def emission_since(self, start: int, *, finish: Finish | None = None) -> Emission:
        return Emission(
            request_id=self.request_id,
            token_ids=tuple(self.output_ids[start:]),
            logprobs=tuple(self.output_logprobs[start:]),
            policy_versions=tuple(self.output_versions[start:]),
            finish=finish,
        )


def finish_after(seq: Sequence, token: int, *, eos_ids: frozenset[int], max_context: int) -> Finish | None:
    """Whether the token just appended ends the generation.

    Example:
        max_tokens 3, output [5, 9, 7] -> LENGTH;  stop_ids {9}, output [5, 9] -> STOP
    """
    if token in eos_ids or token in seq.sampling.stop_ids:
        return Finish.STOP
    if len(seq.output_ids) >= seq.sampling.max_tokens:
        return Finish.LENGTH
    if seq.num_tokens >= max_context:
        return Finish.CONTEXT_LENGTH
    return None


def common_prefix_len(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    """Example: common_prefix_len([1, 2, 3], [1, 2, 4, 5]) -> 2"""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
