"""The emulated engine's stand-in for a KV cache: the cached token ids, and the import checks (pure).

EMULATION ONLY. A real cache of Qwen3-235B holds 192 kB per token; the emulated one carries the
ids alone (4 bytes each, little-endian), which is all the receiving engine needs to continue the
script, and charges the real cache's transfer time on import (`EngineTiming.kv_move_s`).

Example: ids (1, 7) -> b"\\x01\\x00\\x00\\x00\\x07\\x00\\x00\\x00"
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from gyre.errors import InvalidArgument
from services.engine.kv_layout import ExportedKv, sha256_hex

ID_BYTES = 4


def pack_ids(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def check_emulated_import(header: ExportedKv, data: bytes, *, model_id: str) -> None:
    """Refuse a cache this engine cannot continue exactly; the field named is the header's."""
    if header.layout.model_id != model_id:
        raise InvalidArgument(
            "header.layout.model_id",
            f"cache is from model {header.layout.model_id!r}, this engine serves {model_id!r}",
        )
    n = header.num_cached_tokens
    if not 0 <= n <= len(header.token_ids):
        raise InvalidArgument("header.num_cached_tokens", f"must be between 0 and {len(header.token_ids)}")
    expected = ID_BYTES * n
    if header.size_bytes != expected or len(data) != expected:
        raise InvalidArgument(
            "header.size_bytes",
            f"{n} cached tokens take {expected} bytes here; header says {header.size_bytes}, "
            f"{len(data)} arrived",
        )
    if sha256_hex(data) != header.sha256:
        raise InvalidArgument("header.sha256", "the received bytes do not match the declared SHA-256")
    if list(struct.unpack(f"<{n}I", data)) != list(header.token_ids[:n]):
        raise InvalidArgument("chunks", "the cache does not hold the header's token ids")
