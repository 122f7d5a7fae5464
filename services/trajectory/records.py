"""Call records as the trajectory service holds them, and their validation (pure).

A record is what the proxy captured for one model call (DESIGN section 4). Its prompt is either
full (`prompt_ids`) or a delta against an earlier call of the same execution
(`PromptDelta`). Token arrays are numpy (int32 ids, float32 log-probabilities, int64 versions)
because executions reach a million tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from gyre.errors import InvalidArgument

Int32Array = npt.NDArray[np.int32]
Float32Array = npt.NDArray[np.float32]
Int64Array = npt.NDArray[np.int64]

ROLES = ("main", "sub", "summary")
DEFAULT_ROLE_RANK: tuple[str, ...] = ("main", "sub", "summary")
MAX_ID_CHARS = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptDelta:
    """The prompt is `parent`'s prompt + output cut to `num_shared_tokens`, then `new_ids`."""

    parent_call_id: str
    num_shared_tokens: int
    new_ids: Int32Array


@dataclass(frozen=True, slots=True, kw_only=True)
class CallMeta:
    """What a call carries besides tokens; stored as is, returned by GetCall."""

    engine_id: str = ""
    num_migrations: int = 0
    finish_reason: str = "stop"
    started_at: datetime | None = None
    finished_at: datetime | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecord:
    execution_id: str
    call_id: str
    agent_role: str
    agent_id: str
    prompt: Int32Array | PromptDelta
    output_ids: Int32Array
    output_logprobs: Float32Array
    policy_version: int
    output_policy_versions: Int64Array = field(default_factory=lambda: np.zeros(0, np.int64))
    """Per output token; empty when every token has `policy_version`."""
    meta: CallMeta = field(default_factory=CallMeta)

    def versions(self) -> Int64Array:
        """Policy version of every output token."""
        if len(self.output_policy_versions):
            return self.output_policy_versions
        return np.full(len(self.output_ids), self.policy_version, np.int64)


def validate_record(r: CallRecord) -> None:
    """Raise InvalidArgument naming the first thing wrong with a record (shape, not tree facts)."""
    for name, value in (("execution_id", r.execution_id), ("call_id", r.call_id), ("agent_id", r.agent_id)):
        if not 1 <= len(value) <= MAX_ID_CHARS:
            raise InvalidArgument(name, f"must be 1..{MAX_ID_CHARS} characters, got {value!r}")
    if r.agent_role not in ROLES:
        raise InvalidArgument("agent_role", f"must be one of {', '.join(ROLES)}, got {r.agent_role!r}")
    _non_negative("output_ids", r.output_ids)
    if isinstance(r.prompt, PromptDelta):
        _non_negative("prompt_delta.new_ids", r.prompt.new_ids)
        if not r.prompt.parent_call_id:
            raise InvalidArgument("prompt_delta.parent_call_id", "must name an earlier call")
        if r.prompt.num_shared_tokens < 0:
            raise InvalidArgument("prompt_delta.num_shared_tokens", "must be >= 0")
    else:
        _non_negative("prompt_ids", r.prompt)
    if len(r.output_logprobs) != len(r.output_ids):
        raise InvalidArgument(
            "output_logprobs",
            f"has {len(r.output_logprobs)} entries, output_ids has {len(r.output_ids)}; they must agree",
        )
    if not np.all(np.isfinite(r.output_logprobs)) or np.any(r.output_logprobs > 0):
        raise InvalidArgument("output_logprobs", "must be finite log-probabilities (<= 0)")
    n_versions = len(r.output_policy_versions)
    if n_versions and n_versions != len(r.output_ids):
        raise InvalidArgument(
            "output_policy_versions",
            f"has {n_versions} entries, output_ids has {len(r.output_ids)}; give one per token or none",
        )
    if r.policy_version < 0 or (n_versions and int(r.output_policy_versions.min()) < 0):
        raise InvalidArgument("policy_version", "must be >= 0")


def _non_negative(name: str, ids: Int32Array) -> None:
    if len(ids) and int(ids.min()) < 0:
        where = int(np.flatnonzero(ids < 0)[0])
        raise InvalidArgument(name, f"token ids must be >= 0, got {int(ids[where])} at index {where}")


def _int_list(obj: dict[str, Any], key: str, *, required: bool = True) -> list[int]:
    if key not in obj:
        if required:
            raise InvalidArgument(key, "missing")
        return []
    value = obj[key]
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise InvalidArgument(key, "must be a list of integers")
    return value


def _text(obj: dict[str, Any], key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if value is None:
        raise InvalidArgument(key, "missing")
    if not isinstance(value, str):
        raise InvalidArgument(key, f"must be a string, got {type(value).__name__}")
    return value


def record_from_json(obj: Any) -> CallRecord:
    """Parse the JSON shape of DESIGN section 4 (a full prompt, or `prompt_delta`), validated.

    Example:
        {"execution_id": "e1", "call_id": "c7", "agent_role": "main", "agent_id": "main",
         "prompt_ids": [1, 2, 3], "output_ids": [100, 101], "output_logprobs": [-0.1, -0.7],
         "policy_version": 4}
    """
    if not isinstance(obj, dict):
        raise InvalidArgument("record", "must be a JSON object")
    if "prompt_delta" in obj:
        d = obj["prompt_delta"]
        if not isinstance(d, dict):
            raise InvalidArgument("prompt_delta", "must be an object")
        shared = d.get("num_shared_tokens")
        if not isinstance(shared, int):
            raise InvalidArgument("prompt_delta.num_shared_tokens", "must be an integer")
        prompt: Int32Array | PromptDelta = PromptDelta(
            parent_call_id=_text(d, "parent_call_id"),
            num_shared_tokens=shared,
            new_ids=_ids(_int_list(d, "new_ids"), "prompt_delta.new_ids"),
        )
    else:
        prompt = _ids(_int_list(obj, "prompt_ids"), "prompt_ids")
    logprobs = obj.get("output_logprobs")
    if not isinstance(logprobs, list) or not all(isinstance(v, int | float) for v in logprobs):
        raise InvalidArgument("output_logprobs", "missing or not a list of numbers")
    version = obj.get("policy_version", 0)
    if not isinstance(version, int):
        raise InvalidArgument("policy_version", "must be an integer")
    record = CallRecord(
        execution_id=_text(obj, "execution_id"),
        call_id=_text(obj, "call_id"),
        agent_role=_text(obj, "agent_role"),
        agent_id=_text(obj, "agent_id", obj.get("agent_role")),
        prompt=prompt,
        output_ids=_ids(_int_list(obj, "output_ids"), "output_ids"),
        output_logprobs=np.asarray(logprobs, np.float32),
        policy_version=version,
        output_policy_versions=np.asarray(_int_list(obj, "output_policy_versions", required=False), np.int64),
        meta=CallMeta(engine_id=_text(obj, "engine_id", "")),
    )
    validate_record(record)
    return record


def _ids(values: list[int], name: str) -> Int32Array:
    arr = np.asarray(values, np.int64)
    if len(arr) and (int(arr.max()) > np.iinfo(np.int32).max or int(arr.min()) < 0):
        bad = int(np.flatnonzero((arr < 0) | (arr > np.iinfo(np.int32).max))[0])
        raise InvalidArgument(name, f"token ids must be in 0..2^31-1, got {int(arr[bad])} at index {bad}")
    return arr.astype(np.int32)


def record_to_json(r: CallRecord, *, full_prompt: Int32Array | None = None) -> dict[str, Any]:
    """The DESIGN section 4 JSON of a record; pass `full_prompt` to write a delta out in full."""
    out: dict[str, Any] = {"execution_id": r.execution_id, "call_id": r.call_id}
    out |= {"agent_role": r.agent_role, "agent_id": r.agent_id}
    if full_prompt is not None:
        out["prompt_ids"] = full_prompt.tolist()
    elif isinstance(r.prompt, PromptDelta):
        out["prompt_delta"] = {
            "parent_call_id": r.prompt.parent_call_id,
            "num_shared_tokens": r.prompt.num_shared_tokens,
            "new_ids": r.prompt.new_ids.tolist(),
        }
    else:
        out["prompt_ids"] = r.prompt.tolist()
    out["output_ids"] = r.output_ids.tolist()
    out["output_logprobs"] = [float(x) for x in r.output_logprobs]
    out["policy_version"] = r.policy_version
    if len(r.output_policy_versions):
        out["output_policy_versions"] = r.output_policy_versions.tolist()
    out["engine_id"] = r.meta.engine_id
    return out
