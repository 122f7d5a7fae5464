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

from collections.abc import Sequence

import torch

from services.engine.kv_layout import ExportedKv, KvLayout, check_import, sha256_hex

__all__ = [
    "DTYPES",
    "ExportedKv",
    "KvLayout",
    "LayerKV",
    "check_import",
    "deserialize_kv",
    "serialize_kv",
    "sha256_hex",
]

LayerKV = tuple[torch.Tensor, torch.Tensor]
"""One layer's (keys_HTD, values_HTD) of one generation."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


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
