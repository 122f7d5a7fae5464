"""The engine port: what the gRPC service needs from any engine adapter (interface: types only).

Two adapters implement it: `EngineLoop` over the torch reference engine (loop.py) and the vLLM
adapter (vllm_engine.py). The contract suite (tests/test_engine_contract.py) runs against each.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

from services.engine.kv_layout import ExportedKv, KvLayout
from services.engine.sampling_params import Sampling
from services.engine.sequence import Emission


class EngineState(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"
    DRAINED = "drained"
    UPDATING_WEIGHTS = "updating_weights"


@dataclass(frozen=True, slots=True, kw_only=True)
class PausedGeneration:
    """What Pause answers: the output so far and where its KV is held."""

    request_id: str
    output: Emission
    num_cached_tokens: int
    kv_size_bytes: int
    layout: KvLayout
    expires_at_s: float
    """Unix time after which the engine drops the cache unless resumed or cancelled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainResult:
    paused_request_ids: tuple[str, ...]
    num_running: int
    state: EngineState


@dataclass(frozen=True, slots=True, kw_only=True)
class WeightsUpdate:
    previous_version: int
    version: int
    duration_s: float
    num_generations_continued: int


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    engine_id: str
    cell_id: str
    state: EngineState
    policy_version: int
    num_running: int
    num_waiting: int
    num_paused: int
    num_kv_tokens_used: int
    num_kv_tokens_total: int
    output_tokens_per_s: float
    num_prefill_tokens: int
    num_prefix_cache_hit_tokens: int
    num_output_tokens: int
    model_fingerprint: str = ""


class GenerationStream(Protocol):
    """Token pieces of one generation stream; the last carries `finish`. Closing it early cancels."""

    num_prompt_tokens: int
    num_cached_prompt_tokens: int

    def __aiter__(self) -> AsyncIterator[Emission]: ...


class EngineBackend(Protocol):
    engine_id: str
    supports_kv_migration: bool

    async def run(self, stop: asyncio.Event) -> None:
        """The adapter's own work loop, until `stop` is set."""

    async def generate(
        self, *, request_id: str, execution_id: str, prompt_ids: list[int], sampling: Sampling
    ) -> GenerationStream: ...

    async def pause(self, request_id: str) -> PausedGeneration: ...

    async def export_kv(self, request_id: str) -> tuple[ExportedKv, bytes]: ...

    async def import_kv(self, header: ExportedKv, data: bytes) -> PausedGeneration: ...

    async def resume(self, request_id: str) -> GenerationStream: ...

    async def cancel(self, request_id: str) -> int: ...

    async def drain(self, *, request_id: str, pause_in_flight: bool, release_memory: bool) -> DrainResult: ...

    def stats(self) -> EngineStats: ...

    async def update_weights(
        self, *, request_id: str, version: int, source_uri: str, sha256: str
    ) -> WeightsUpdate: ...
