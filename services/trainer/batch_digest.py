"""The checksum of a step's batch: SHA-256 over the trained samples in a fixed encoding (pure).

The trainer records it with the step; `gyre replay step N` re-derives the samples from the
trajectory service and must arrive at the same hex digest. The encoding is spelled out here so
that any client can recompute it: per sample, in batch order,

    len-prefixed UTF-8 of execution_id, trajectory_id, agent_role   (u32 LE length, bytes)
    n = number of tokens                                            (u32 LE)
    token_ids int32 LE, loss_mask u8, token_weight float32 LE,
    old_logprobs float32 LE, policy_versions u64 LE                 (n each)
    reward, advantage                                               (float64 LE)

Weights and logprobs travel as float32 on the wire, so encoding them as float32 loses nothing.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

from services.trainer.samples import Sample


def _text(h: hashlib._Hash, value: str) -> None:
    raw = value.encode()
    h.update(struct.pack("<I", len(raw)))
    h.update(raw)


def batch_sha256(samples: Sequence[Sample]) -> str:
    """Hex SHA-256 of `samples` in order.

    Example:
        batch_sha256([]) == hashlib.sha256(b"").hexdigest()
        swapping two samples changes the digest; so does any one token's weight
    """
    h = hashlib.sha256()
    for s in samples:
        _text(h, s.execution_id)
        _text(h, s.trajectory_id)
        _text(h, s.agent_role)
        n = len(s.token_ids)
        h.update(struct.pack("<I", n))
        h.update(struct.pack(f"<{n}i", *s.token_ids))
        h.update(struct.pack(f"<{n}B", *(1 if m else 0 for m in s.loss_mask)))
        h.update(struct.pack(f"<{n}f", *s.token_weight))
        h.update(struct.pack(f"<{n}f", *s.old_logprobs))
        h.update(struct.pack(f"<{n}Q", *s.policy_versions))
        h.update(struct.pack("<dd", s.reward, s.advantage))
    return h.hexdigest()
