"""The emulated engine's settings and the stream one reader of a generation gets (shell: asyncio).

EMULATION ONLY (see `emulated_engine.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from services.engine.sequence import Emission


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatedEngineConfig:
    engine_id: str
    cell_id: str
    model_id: str
    """The fingerprint every cell of one emulated cluster shares (`emulated:<profile>`)."""
    vocab_size: int
    eos_id: int
    reply_tokens: int = 64
    """Length of the scripted reply when `max_tokens` does not cut it first."""
    max_context_tokens: int = 131072
    time_scale: float = 1.0
    """Every modelled duration is divided by this (a 40-minute run in 4 minutes at 10)."""
    tick_s: float = 0.02
    paused_ttl_s: float = 600.0
    prefix_cache_executions: int = 4096
    policy_version: int = 0


@dataclass(slots=True, eq=False)
class EmulatedStream:
    """One reader of one generation: a replay of what it missed, then live pieces."""

    on_close: Callable[[EmulatedStream, bool], None]
    """Called once the reader is done, with whether the generation ended."""
    request_id: str
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    replay: Emission | None
    queue: asyncio.Queue[Emission] = field(default_factory=asyncio.Queue)

    async def _pieces(self) -> AsyncIterator[Emission]:
        finished = False
        try:
            if self.replay is not None:
                yield self.replay
                finished = self.replay.finish is not None
            while not finished:
                piece = await self.queue.get()
                finished = piece.finish is not None
                yield piece
        finally:
            self.on_close(self, finished)

    def __aiter__(self) -> AsyncIterator[Emission]:
        return self._pieces()
