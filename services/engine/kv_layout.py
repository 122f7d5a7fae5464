"""KV cache layout, the header of a moved cache, and the checks an import must pass (pure, no torch).

Torch-free so that the port, the gRPC shell and the emulated engine (which holds no tensors) can
use them; the tensor side (serialization) is in `kv.py`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from gyre.errors import InvalidArgument
from services.engine.sampling_params import Sampling

ELEMENT_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True, kw_only=True)
class KvLayout:
    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size_tokens: int = 1

    def size_bytes(self, num_tokens: int) -> int:
        element = ELEMENT_BYTES[self.dtype]
        return 2 * self.num_layers * self.num_kv_heads * num_tokens * self.head_dim * element


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_import(
    *,
    mine: KvLayout,
    theirs: KvLayout,
    num_cached_tokens: int,
    num_token_ids: int,
    declared_size_bytes: int,
    declared_sha256: str,
    data: bytes,
) -> None:
    """Refuse a KV cache this engine cannot use exactly; the field named is the header's."""
    if theirs.model_id != mine.model_id:
        raise InvalidArgument(
            "header.layout.model_id",
            f"cache is from model {theirs.model_id!r}, this engine serves {mine.model_id!r}",
        )
    if theirs != mine:
        raise InvalidArgument("header.layout", f"cache layout {theirs} differs from this engine's {mine}")
    if not 0 <= num_cached_tokens <= num_token_ids:
        raise InvalidArgument(
            "header.num_cached_tokens",
            f"must be between 0 and the {num_token_ids} token ids, got {num_cached_tokens}",
        )
    expected = mine.size_bytes(num_cached_tokens)
    if declared_size_bytes != expected:
        raise InvalidArgument(
            "header.size_bytes",
            f"{num_cached_tokens} cached tokens take {expected} bytes in this layout, header says "
            f"{declared_size_bytes}",
        )
    if len(data) != declared_size_bytes:
        raise InvalidArgument(
            "chunks", f"stream carried {len(data)} of {declared_size_bytes} bytes: truncated or overlong"
        )
    if sha256_hex(data) != declared_sha256:
        raise InvalidArgument("header.sha256", "the received bytes do not match the declared SHA-256")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExportedKv:
    """A paused generation's state and cache bytes, as sent to another engine."""

    request_id: str
    execution_id: str
    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    num_cached_tokens: int
    output_logprobs: tuple[float, ...]
    output_versions: tuple[int, ...]
    sampling: Sampling
    layout: KvLayout
    size_bytes: int
    sha256: str
