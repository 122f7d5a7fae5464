"""Samples as packed arrays (`PackedSamples`, format 1), as the trainer receives and hands them on (pure).

Each per-token field of every sample is concatenated into one little-endian array, cut by the
samples' token counts, with a CRC-32 over the arrays. Decoding refuses, naming what is wrong, a
format version other than 1, arrays whose sizes disagree with the token counts, per-sample lists
of different lengths, and a checksum that does not match: a damaged payload never becomes a
half-right batch.

Example:
    two samples of 3 and 2 tokens -> num_tokens [3, 2], token_ids 20 bytes (5 x int32),
    loss_mask 5 bytes, token_weight 20, old_logprobs 20, policy_versions 40 (int64)
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from gyre.errors import InvalidArgument
from gyre.trajectory.v1 import trajectory_pb2
from services.trainer.samples import Sample

FORMAT_VERSION = 1
ARRAYS: tuple[tuple[str, str], ...] = (
    ("token_ids", "<i4"),
    ("loss_mask", "u1"),
    ("token_weight", "<f4"),
    ("old_logprobs", "<f4"),
    ("policy_versions", "<i8"),
)
"""(field, dtype) of every per-token array, in checksum order."""
PER_SAMPLE = ("execution_ids", "trajectory_ids", "agent_roles", "task_ids", "rewards", "advantages")


class PackedSamplesInvalid(InvalidArgument):
    """A packed payload that cannot be trusted: wrong version, sizes or checksum."""


def _checksum(arrays: Sequence[bytes]) -> int:
    crc = 0
    for data in arrays:
        crc = zlib.crc32(data, crc)
    return crc


def encode_samples(samples: Sequence[Sample]) -> trajectory_pb2.PackedSamples:
    """The samples as one `PackedSamples` message (task ids empty, has_reward true)."""
    arrays = {
        name: np.fromiter(
            (v for s in samples for v in getattr(s, name)),
            dtype=dtype,
            count=sum(len(s.token_ids) for s in samples),
        ).tobytes()
        for name, dtype in ARRAYS
    }
    return trajectory_pb2.PackedSamples(
        format_version=FORMAT_VERSION,
        execution_ids=[s.execution_id for s in samples],
        trajectory_ids=[s.trajectory_id for s in samples],
        agent_roles=[s.agent_role for s in samples],
        task_ids=["" for _ in samples],
        num_tokens=[len(s.token_ids) for s in samples],
        rewards=[s.reward for s in samples],
        advantages=[s.advantage for s in samples],
        has_rewards=[True for _ in samples],
        crc32=_checksum([arrays[name] for name, _ in ARRAYS]),
        **arrays,
    )


def decode_samples(packed: trajectory_pb2.PackedSamples, *, field: str = "packed") -> tuple[Sample, ...]:
    """The samples of a `PackedSamples`; PackedSamplesInvalid names the field that is wrong."""
    if packed.format_version != FORMAT_VERSION:
        raise PackedSamplesInvalid(
            f"{field}.format_version", f"is {packed.format_version}, this trainer reads {FORMAT_VERSION}"
        )
    n = len(packed.num_tokens)
    for name in PER_SAMPLE:
        got = len(getattr(packed, name))
        if got != n:
            raise PackedSamplesInvalid(f"{field}.{name}", f"has {got} entries for {n} samples")
    total = sum(packed.num_tokens)
    for name, dtype in ARRAYS:
        data = getattr(packed, name)
        expected = total * np.dtype(dtype).itemsize
        if len(data) != expected:
            raise PackedSamplesInvalid(
                f"{field}.{name}",
                f"has {len(data)} bytes, expected {expected} ({total} tokens of {np.dtype(dtype).name})",
            )
    crc = _checksum([getattr(packed, name) for name, _ in ARRAYS])
    if crc != packed.crc32:
        raise PackedSamplesInvalid(
            f"{field}.crc32", f"is {packed.crc32:#010x}, the arrays hash to {crc:#010x}"
        )
    ids = np.frombuffer(packed.token_ids, dtype="<i4").tolist()
    mask = (np.frombuffer(packed.loss_mask, dtype="u1") != 0).tolist()
    weight = np.frombuffer(packed.token_weight, dtype="<f4").tolist()
    old = np.frombuffer(packed.old_logprobs, dtype="<f4").tolist()
    versions = np.frombuffer(packed.policy_versions, dtype="<i8").tolist()
    out = []
    start = 0
    for i, t in enumerate(packed.num_tokens):
        cut = slice(start, start + t)
        out.append(
            Sample(
                execution_id=packed.execution_ids[i],
                trajectory_id=packed.trajectory_ids[i],
                agent_role=packed.agent_roles[i],
                token_ids=tuple(ids[cut]),
                loss_mask=tuple(mask[cut]),
                token_weight=tuple(weight[cut]),
                old_logprobs=tuple(old[cut]),
                policy_versions=tuple(versions[cut]),
                reward=packed.rewards[i],
                advantage=packed.advantages[i],
            )
        )
        start += t
    return tuple(out)
