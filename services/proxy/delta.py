"""Delta-encode a call's prompt against the execution's earlier call it shares most with (pure).

An hour-long execution sends its growing context on every call; recording it whole each time
would be quadratic. Each recorded call keeps `prompt + output`; a new prompt names the earlier
call whose `prompt + output` shares the longest prefix with it and carries only the rest.

Example:
    history: c1 = [1, 2, 3] + [100, 101], c2 = [1, 2, 9] + [102]
    prompt [1, 2, 3, 100, 101, 4, 5] -> parent c1, num_shared_tokens 5, new_ids [4, 5]
    prompt [7, 8]                    -> full prompt (nothing shared)
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, kw_only=True)
class Delta:
    """`parent_call_id` empty means a full prompt (`num_shared_tokens` 0)."""

    parent_call_id: str
    num_shared_tokens: int
    new_ids: tuple[int, ...]


def shared_prefix_len(a: array[int], b: array[int]) -> int:
    """Length of the common prefix, by halving over memory compares (fast for long contexts)."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # invariant: a[:lo] == b[:lo] and a[:hi+1] != b[:hi+1] (after the first probe)
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(slots=True)
class CallHistory:
    """One execution's recorded calls as `prompt + output` (mutable; owned by the call shell)."""

    contexts: dict[str, array[int]] = field(default_factory=dict)

    def add(self, call_id: str, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> None:
        self.contexts[call_id] = array("i", [*prompt_ids, *output_ids])

    def encode(self, prompt_ids: Sequence[int]) -> Delta:
        prompt = array("i", prompt_ids)
        best_id, best_len = "", 0
        for call_id, context in self.contexts.items():
            n = shared_prefix_len(prompt, context)
            if n > best_len:
                best_id, best_len = call_id, n
        return Delta(parent_call_id=best_id, num_shared_tokens=best_len, new_ids=tuple(prompt[best_len:]))
