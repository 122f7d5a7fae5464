"""Engine settings, env prefix GYRE_ENGINE_ (shell)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic_settings import BaseSettings, SettingsConfigDict


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_ENGINE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port; 0 picks a free one."""
    model_dir: Path = Path(".gyre/model")
    """Hugging Face checkpoint folder (`gyre model init` writes the tiny one)."""
    init_model_if_missing: bool = True
    """Write the tiny local model into `model_dir` if it holds no checkpoint (local stack, tests)."""
    adapter: Literal["torch", "vllm"] = "torch"
    """Which engine serves: the torch reference engine, or vLLM (GPU, extra `[vllm]`)."""
    engine_id: str = "engine-0"
    cell_id: str = "cell-0"
    policy_version: int = 0
    """Policy version of the weights in `model_dir`."""
    max_batch: int = 32
    """Most generations decoded together per step; more wait."""
    prefill_chunk_tokens: int = 2048
    """Most prompt tokens prefilled per step; the running generations decode a token between two
    chunks, so this bounds how long a long prompt holds them back (a chunk late in a 53k-token
    prompt reads all the keys before it). Smaller chunks prefill slower (at 512 the tiny model's
    8k-token prefill ran at 0.5-0.9x its 2048 rate on the shared development machine)."""
    prefix_cache_max_tokens: int = 65536
    """Token positions of finished generations kept for reuse by later calls of the same execution."""
    paused_ttl_s: float = 600.0
    """A paused generation's cache is dropped after this long unless resumed or cancelled."""
    num_threads: int = 2
    """torch intra-op threads (CPU)."""
    publish_events: bool = True
    """Publish EngineWeightsUpdated / EngineDrained on NATS (GYRE_NATS_URL or the local stack's)."""
    follow_weights: bool = True
    """Apply each `WeightsPublished` of the trainer (own durable consumer per `engine_id`)."""
