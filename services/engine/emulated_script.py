"""The emulated engine's output: scripted, deterministic token ids (pure).

EMULATION ONLY. The same prompt gives the same reply on every engine, so a generation moved to
another cell (or re-run after a crash) continues with exactly the tokens it would have produced
where it started, and a run can be repeated token for token. The ids avoid the special ids
below 100 of small vocabularies and end with the end-of-turn id, so the proxy sees a finished
turn; logprobs are a fixed figure, since no model computed them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

LOGPROB = -0.5
FIRST_ID = 100


def reply_ids(prompt_ids: Sequence[int], *, length: int, vocab_size: int, eos_id: int) -> list[int]:
    """`length` ids for this prompt, the last one `eos_id`.

    Example: a 3-token reply is two ids drawn from the prompt's digest, then eos_id.
    """
    if length <= 0:
        return []
    tail = ",".join(str(t) for t in prompt_ids[-16:])
    seed = int.from_bytes(hashlib.sha256(f"{len(prompt_ids)}:{tail}".encode()).digest()[:8], "big")
    span = max(vocab_size - FIRST_ID, 1)
    ids: list[int] = []
    for i in range(length - 1):
        token = FIRST_ID + (seed + i * 7919) % span
        ids.append(token if token != eos_id else FIRST_ID)
    return [*ids, eos_id]
