"""Proxy settings, env prefix GYRE_PROXY_ (shell)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class ProxySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GYRE_PROXY_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 0
    """gRPC port (ProxyService); 0 picks a free one."""
    http_port: int = 0
    """HTTP port of the OpenAI / Anthropic APIs; 0 picks a free one."""
    model_dir: Path = Path(".gyre/model")
    """Folder with the served model's tokenizer and chat template (`gyre model init DIR`)."""
    model_name: str = ""
    """Name `/v1/models` reports; default the folder's name. Requests may name any model."""
    context_window_tokens: int = 0
    """Prompt + output limit; 0 takes `max_position_embeddings` from the folder's config.json."""
    max_body_bytes: int = 32 * 1024 * 1024
    """Largest request body accepted (HTTP 413 above). The parts a request renders are bounded
    tighter, by the context window (HTTP 400 naming the largest part: `request_size`)."""
    renders_per_execution: int = Field(default=1, ge=1)
    """Requests of one execution decoded, parsed or rendered at once (the others wait their turn):
    one execution's many connections cannot take the workers every other execution needs."""
    refusal_wait_max_s: float = Field(default=1.0, ge=0)
    """After a request refused for its input (4xx), the execution's next request waits 2 to 16
    times the worker CPU the refused one used, at most this long (0: never): a flood of refusals
    costs its sender's time, not its neighbours' (`fair_queue.refusal_wait_s`)."""
    token_cache_s: float = 5.0
    """How long a token lookup is trusted before Postgres is asked again."""
    weights_wait_s: float = 30.0
    """How long a call waits for an engine holding weights of its execution's admitted version
    (engines load a new version a moment after the trainer publishes it) before HTTP 503."""
    engine_stall_s: float = 120.0
    """An engine stream with no token for this long is treated as a failed engine: the call moves
    to another engine (recomputing its prefix) and the engine rests. Long enough for a long
    prompt's prefill on a loaded CPU cell; 0 turns the check off."""
    processes: int = Field(default=1, ge=1, le=64)
    """Proxy processes serving the HTTP APIs on one port (SO_REUSEPORT), each execution's calls
    served by one of them (`pinning`): more cores for the proxy's CPU work. The first process
    starts the others and serves the gRPC API."""
    process_index: int = Field(default=0, ge=0)
    """Set by the first process for the ones it starts; leave unset."""
    peer_urls: str = ""
    """Set by the first process for the ones it starts (every process's private URL); leave unset."""
    peer_secret: str = ""
    """Set by the first process for the ones it starts; leave unset."""
    thread_switch_interval_s: float = Field(default=0.0005, gt=0)
    """How long a worker thread rendering a prompt (the chat template is Python) may hold the GIL
    while the event loop waits for it (Python's default is 5 ms). Every streamed chunk of every
    call waits up to this long for the loop's turn while renders run."""
