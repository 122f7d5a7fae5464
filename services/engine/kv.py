"""KV cache layout, serialization for migration, and the checks an import must pass (pure, torch).

The wire form of one generation's cache is every layer's keys then values, each a contiguous
[H, T, D] tensor in the layout's dtype, concatenated layer by layer (`block_size_tokens` is 1:
the torch engine keeps one contiguous cache per generation). The receiver checks the model
fingerprint and layout, the byte count implied by the number of cached tokens, and the SHA-256 of
what arrived; any mismatch is INVALID_ARGUMENT and nothing is kept.

This is the TCP path (gRPC chunks). On GPU clusters the same header travels over gRPC while the
bytes move device to device over RDMA (NIXL or the Mooncake Transfer Engine) into blocks the
receiver reserved; the checks are the same.

Legend: L layers, H KV heads, T cached tokens, D head size.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gyre.errors import InvalidArgument
from services.engine.sampling import Sampling

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (keys_HTD, values_HTD) of one generation."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class KvLayout:
    model_id: str
    dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size_tokens: int = 1

    def size_bytes(self, num_tokens: int) -> int:
        element = torch.empty((), dtype=DTYPES[self.dtype]).element_size()
        return 2 * self.num_layers * self.num_kv_heads * num_tokens * self.head_dim * element


def serialize_kv(layers: Sequence[LayerKV]) -> bytes:
    """Concatenate every layer's keys then values as raw bytes (see the module docstring)."""
    parts: list[bytes] = []
    for keys_HTD, values_HTD in layers:
        for t in (keys_HTD, values_HTD):
            parts.append(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return b"".join(parts)


def deserialize_kv(data: bytes, *, layout: KvLayout, num_tokens: int) -> list[LayerKV]:
    """Inverse of `serialize_kv`; the caller has checked the size already."""
    shape = (layout.num_kv_heads, num_tokens, layout.head_dim)
    flat = torch.frombuffer(bytearray(data), dtype=DTYPES[layout.dtype])
    step = layout.num_kv_heads * num_tokens * layout.head_dim
    out: list[LayerKV] = []
    for layer in range(layout.num_layers):
        base = 2 * layer * step
        out.append((flat[base : base + step].view(shape), flat[base + step : base + 2 * step].view(shape)))
    return out


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
