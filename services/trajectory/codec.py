"""Compact storage of token arrays: byte planes + zstd, one blob per call (pure).

Token ids of a BPE vocabulary (~152k entries) use 17-18 of an int32's 32 bits and frequent
tokens have small ids, so splitting the little-endian bytes into planes (all low bytes, then all
second bytes, ...) leaves two planes that are almost constant; zlib's Huffman stage then stores
them for next to nothing. Log-probabilities get the same treatment (their sign/exponent byte is
nearly constant). The blob is stored as `bytea` with TOAST compression off (it is already
compressed).

zstd level 1 rather than zlib: on these planes it is a little smaller than zlib level 1,
compresses ~4x and decompresses ~3x faster, and decompression is what bounds a cold replay.
Blobs written by the first version (zlib) are still read: a zstd frame starts with its magic
number, a zlib stream never does.

Example:
    blob = pack_arrays([np.array([1, 2, 3], np.int32), np.array([-0.5], np.float32)])
    unpack_arrays(blob, [(np.int32, 3), (np.float32, 1)]) -> [array([1, 2, 3]), array([-0.5])]
"""

from __future__ import annotations

import sys
import threading
import zlib
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import zstandard

ZSTD_LEVEL = 1  # higher levels buy ~0.5% here and cost ingest time
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _planes(arr: npt.NDArray[np.generic]) -> bytes:
    itemsize = arr.dtype.itemsize
    raw = np.ascontiguousarray(arr).view(np.uint8)
    # One strided pass per plane: several times faster than transposing an (n, itemsize) array.
    return b"".join(raw[i::itemsize].tobytes() for i in range(itemsize))


def _unplanes(data: bytes, dtype: npt.DTypeLike, n: int) -> npt.NDArray[np.generic]:
    dt = np.dtype(dtype)
    planes = np.frombuffer(data, dtype=np.uint8).reshape(dt.itemsize, n)
    out = np.empty(n * dt.itemsize, np.uint8)
    for i in range(dt.itemsize):
        out[i :: dt.itemsize] = planes[i]
    return out.view(dt.newbyteorder("<")).astype(dt, copy=False)


def pack_arrays(arrays: Sequence[npt.NDArray[np.generic]]) -> bytes:
    """Concatenate each array's byte planes and compress the lot once."""
    # A (de)compressor per call: they are cheap to make and not safe to share across threads.
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(b"".join(_planes(a) for a in arrays))


_per_thread = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """One decompressor per thread: making one costs ~20 us, more than decompressing a call's blob,
    and one must not be shared across threads."""
    d: zstandard.ZstdDecompressor | None = getattr(_per_thread, "zstd", None)
    if d is None:
        d = _per_thread.zstd = zstandard.ZstdDecompressor()
    return d


def decompress(blob: bytes) -> bytes:
    """The raw planes of a blob (zstd, or zlib for blobs from before the switch)."""
    if blob[:4] == ZSTD_MAGIC:
        return _decompressor().decompress(blob)
    return zlib.decompress(blob)


def unpack_arrays(blob: bytes, layout: Sequence[tuple[npt.DTypeLike, int]]) -> list[npt.NDArray[np.generic]]:
    """Inverse of `pack_arrays`, given each array's dtype and length."""
    raw = decompress(blob)
    out: list[npt.NDArray[np.generic]] = []
    offset = 0
    for dtype, n in layout:
        size = np.dtype(dtype).itemsize * n
        out.append(_unplanes(raw[offset : offset + size], dtype, n))
        offset += size
    if offset != len(raw):
        raise ValueError(f"blob holds {len(raw)} bytes, layout expects {offset}")
    return out


Into = tuple[npt.NDArray[np.generic], int]
"""Where `unpack_into` writes one array: a contiguous destination, and how many leading elements to drop."""


def unpack_into(
    blob: bytes, layout: Sequence[tuple[npt.DTypeLike, int]], into: Sequence[Into | None]
) -> None:
    """`unpack_arrays`, writing each array's elements from `skip` on straight into `dest`.

    Replay writes a call's tokens into the tree buffer this way: one pass over the planes
    instead of a temporary array and a second copy. An entry whose `into` is None is skipped.
    """
    assert sys.byteorder == "little", "planes are little-endian and are written into native arrays"
    raw = decompress(blob)
    offset = 0
    for (dtype, n), target in zip(layout, into, strict=True):
        dt = np.dtype(dtype)
        size = dt.itemsize * n
        if target is not None:
            dest, skip = target
            if dest.dtype != dt or len(dest) != n - skip or not dest.flags.c_contiguous:
                raise ValueError(f"destination {dest.dtype}[{len(dest)}] for {dt}[{n}] from {skip}")
            planes = np.frombuffer(raw, np.uint8, size, offset).reshape(dt.itemsize, n)
            out = dest.view(np.uint8)
            for i in range(dt.itemsize):
                out[i :: dt.itemsize] = planes[i, skip:]
        offset += size
    if offset != len(raw):
        raise ValueError(f"blob holds {len(raw)} bytes, layout expects {offset}")
