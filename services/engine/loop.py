"""The torch engine's adapter to the port: one decode loop, commands between steps (shell).

`TorchEngine` is single-threaded; every call into it holds `self._lock`, and heavy calls (a decode
step with its prefills, an export, an import, a weight load) run in a worker thread so the event
loop keeps serving gRPC. asyncio.Lock hands the lock to waiters first, so a Pause, an import or a
weight update waits at most for the decode step in progress: they all land between iterations.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import structlog

from gyre.errors import Conflict, Unavailable
from services.engine.kv import ExportedKv
from services.engine.port import DrainResult, EngineState, EngineStats, PausedGeneration, WeightsUpdate
from services.engine.sampling import Sampling
from services.engine.sequence import Emission, Finish, Sequence, Status
from services.engine.torch_engine import TorchEngine, kv_bytes

log = structlog.get_logger(__name__)

DrainedHook = Callable[[str, bool, tuple[str, ...]], Awaitable[None]]
"""Called with (drain request id, memory released, paused ids) once a drain completes."""
WeightsHook = Callable[[str, WeightsUpdate, str], Awaitable[None]]
"""Called with (update request id, the update, source uri) after a new version is loaded."""


@dataclass(slots=True, kw_only=True, eq=False)
class _Stream:
    """One subscriber of one generation: a replay of what it missed, then live pieces."""

    loop: EngineLoop
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
            await self.loop._unsubscribe(self, finished=finished)

    def __aiter__(self) -> AsyncIterator[Emission]:
        return self._pieces()


class EngineLoop:
    supports_kv_migration = True

    def __init__(
        self,
        core: TorchEngine,
        *,
        cell_id: str = "",
        paused_ttl_s: float = 600.0,
        on_drained: DrainedHook | None = None,
        on_weights: WeightsHook | None = None,
    ) -> None:
        self.core = core
        self.engine_id = core.engine_id
        self.cell_id = cell_id
        self.paused_ttl_s = paused_ttl_s
        self.state = EngineState.SERVING
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._listeners: dict[str, set[_Stream]] = {}
        self._paused_at: dict[str, float] = {}
        self._recent: deque[tuple[float, int]] = deque()
        self._drain: tuple[str, bool, DrainResult] | None = None
        self._answers: dict[str, object] = {}
        self._on_drained = on_drained
        self._on_weights = on_weights

    # --- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Decode while there is work; otherwise sleep until woken (or a second, to expire pauses)."""
        while not stop.is_set():
            if self.core.has_work():
                async with self._lock:
                    emissions = await asyncio.to_thread(self.core.step)
                    self._dispatch(emissions)
                    now = time.monotonic()
                    self._recent.append((now, sum(len(e.token_ids) for e in emissions)))
                    self._trim_recent(now)
                    await self._maybe_drained()
                await asyncio.sleep(0)
                continue
            self._wake.clear()
            stopper = asyncio.ensure_future(stop.wait())
            waker = asyncio.ensure_future(self._wake.wait())
            await asyncio.wait({stopper, waker}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            waker.cancel()
            await self._expire_paused()

    def _dispatch(self, emissions: list[Emission]) -> None:
        for e in emissions:
            if e.finish is Finish.PAUSED:
                self._paused_at[e.request_id] = time.time()
            for stream in self._listeners.get(e.request_id, ()):
                stream.queue.put_nowait(e)

    def _subscribe(self, seq: Sequence, replay: Emission | None) -> _Stream:
        stream = _Stream(
            loop=self,
            request_id=seq.request_id,
            num_prompt_tokens=len(seq.prompt_ids),
            num_cached_prompt_tokens=seq.num_cached_prompt_tokens,
            replay=replay,
        )
        self._listeners.setdefault(seq.request_id, set()).add(stream)
        return stream

    async def _unsubscribe(self, stream: _Stream, *, finished: bool) -> None:
        listeners = self._listeners.get(stream.request_id, set())
        listeners.discard(stream)
        if listeners:
            return
        self._listeners.pop(stream.request_id, None)
        if finished:
            return
        # The last reader went away mid-generation: the generation has no one to serve.
        async with self._lock:
            seq = self.core.seqs.get(stream.request_id)
            if seq is not None and seq.status in (Status.WAITING, Status.RUNNING):
                self.core.cancel(stream.request_id)
                log.info("generation_cancelled_on_close", request_id=stream.request_id)

    async def _expire_paused(self) -> None:
        now = time.time()
        for rid in [r for r, t in self._paused_at.items() if now - t > self.paused_ttl_s]:
            async with self._lock:
                seq = self.core.seqs.get(rid)
                if seq is not None and seq.status is Status.PAUSED:
                    self.core.cancel(rid)
                    log.info("paused_generation_expired", request_id=rid)
                self._paused_at.pop(rid, None)
                await self._maybe_drained()

    # --- generation ------------------------------------------------------------------------

    def _require_serving(self) -> None:
        if self.state in (EngineState.DRAINING, EngineState.DRAINED):
            raise Unavailable(f"engine {self.engine_id} is {self.state.value} and admits no generations")

    async def generate(
        self, *, request_id: str, execution_id: str, prompt_ids: list[int], sampling: Sampling
    ) -> _Stream:
        async with self._lock:
            known = self.core.seqs.get(request_id)
            if known is None:
                self._require_serving()
            seq = self.core.submit(
                request_id=request_id, execution_id=execution_id, prompt_ids=prompt_ids, sampling=sampling
            )
            replay = None
            if known is not None:
                ended = seq.finish if seq.status in (Status.FINISHED, Status.PAUSED) else None
                replay = seq.emission_since(0, finish=ended)
            stream = self._subscribe(seq, replay)
        self._wake.set()
        return stream

    async def resume(self, request_id: str) -> _Stream:
        async with self._lock:
            seq = self.core.get(request_id)
            if seq.status is Status.PAUSED:
                self._require_serving()
            seq = self.core.resume(request_id)
            self._paused_at.pop(request_id, None)
            replay = None
            if len(seq.output_ids) > seq.stream_start or seq.status is Status.FINISHED:
                ended = seq.finish if seq.status is Status.FINISHED else None
                replay = seq.emission_since(seq.stream_start, finish=ended)
            stream = self._subscribe(seq, replay)
        self._wake.set()
        return stream

    def _paused_answer(self, seq: Sequence) -> PausedGeneration:
        return PausedGeneration(
            request_id=seq.request_id,
            output=seq.emission_since(0, finish=Finish.PAUSED),
            num_cached_tokens=seq.num_cached if seq.kv is not None else 0,
            kv_size_bytes=kv_bytes(seq.kv),
            layout=self.core.layout,
            expires_at_s=self._paused_at.get(seq.request_id, time.time()) + self.paused_ttl_s,
        )

    async def pause(self, request_id: str) -> PausedGeneration:
        async with self._lock:
            before = self.core.get(request_id).status
            seq = self.core.pause(request_id)
            if before is not Status.PAUSED:
                self._dispatch([Emission(request_id=request_id, finish=Finish.PAUSED)])
            return self._paused_answer(seq)

    async def cancel(self, request_id: str) -> int:
        async with self._lock:
            before = self.core.get(request_id).status
            freed = self.core.cancel(request_id)
            self._paused_at.pop(request_id, None)
            if before in (Status.WAITING, Status.RUNNING):
                self._dispatch([Emission(request_id=request_id, finish=Finish.CANCELLED)])
            await self._maybe_drained()
            return freed

    # --- migration -------------------------------------------------------------------------

    async def export_kv(self, request_id: str) -> tuple[ExportedKv, bytes]:
        async with self._lock:
            return await asyncio.to_thread(self.core.export_kv, request_id)

    async def import_kv(self, header: ExportedKv, data: bytes) -> PausedGeneration:
        async with self._lock:
            if header.request_id not in self.core.seqs:
                self._require_serving()
            seq = await asyncio.to_thread(self.core.import_kv, header, data)
            self._paused_at.setdefault(seq.request_id, time.time())
            return self._paused_answer(seq)

    # --- drain, weights, stats -------------------------------------------------------------

    async def drain(self, *, request_id: str, pause_in_flight: bool, release_memory: bool) -> DrainResult:
        first = self._answers.get(request_id)
        if isinstance(first, DrainResult):
            return first
        async with self._lock:
            paused: list[str] = []
            if self.state not in (EngineState.DRAINING, EngineState.DRAINED):
                self.state = EngineState.DRAINING
            if pause_in_flight:
                for rid in [*self.core.running, *self.core.waiting]:
                    self.core.pause(rid)
                    self._dispatch([Emission(request_id=rid, finish=Finish.PAUSED)])
                    paused.append(rid)
            result = DrainResult(
                paused_request_ids=tuple(paused),
                num_running=len(self.core.running) + len(self.core.waiting),
                state=self.state,
            )
            self._drain = (request_id, release_memory, result)
            await self._maybe_drained()
            result = DrainResult(
                paused_request_ids=result.paused_request_ids, num_running=result.num_running, state=self.state
            )
            self._answers[request_id] = result
            return result

    async def _maybe_drained(self) -> None:
        """Called under the lock: a drain completes when nothing runs and nothing paused is held."""
        if self.state is not EngineState.DRAINING or self._drain is None:
            return
        if self.core.has_work() or any(s.status is Status.PAUSED for s in self.core.seqs.values()):
            return
        request_id, release, result = self._drain
        if release:
            self.core.release_memory()
        self.state = EngineState.DRAINED
        log.info("engine_drained", engine_id=self.engine_id, memory_released=release)
        if self._on_drained is not None:
            await self._on_drained(request_id, release, result.paused_request_ids)

    async def update_weights(
        self, *, request_id: str, version: int, source_uri: str, sha256: str
    ) -> WeightsUpdate:
        first = self._answers.get(request_id)
        if isinstance(first, WeightsUpdate):
            return first
        async with self._lock:
            previous = self.core.version
            if version == previous and self.core.model is not None:
                return WeightsUpdate(
                    previous_version=previous, version=version, duration_s=0.0, num_generations_continued=0
                )
            if version < previous:
                raise Conflict(f"version {version} is older than the loaded version {previous}")
            state_before = self.state
            self.state = EngineState.UPDATING_WEIGHTS
            started = time.perf_counter()
            try:
                await asyncio.to_thread(
                    self.core.update_weights, version=version, source_uri=source_uri, sha256=sha256
                )
            finally:
                self.state = state_before
            if self.state is EngineState.DRAINED:
                self.state, self._drain = EngineState.SERVING, None
            update = WeightsUpdate(
                previous_version=previous,
                version=version,
                duration_s=time.perf_counter() - started,
                num_generations_continued=len(self.core.running) + len(self.core.waiting),
            )
            self._answers[request_id] = update
        log.info("weights_updated", engine_id=self.engine_id, version=version, duration_s=update.duration_s)
        if self._on_weights is not None:
            await self._on_weights(request_id, update, source_uri)
        return update

    def _trim_recent(self, now: float) -> None:
        """Keep the last ten seconds of steps (trimmed per step, so it stays bounded unread)."""
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()

    def stats(self) -> EngineStats:
        now = time.monotonic()
        self._trim_recent(now)
        span = max(now - self._recent[0][0], 1e-3) if self._recent else 1.0
        seqs = list(self.core.seqs.values())
        return EngineStats(
            engine_id=self.engine_id,
            cell_id=self.cell_id,
            state=self.state,
            policy_version=self.core.version,
            num_running=len(self.core.running),
            num_waiting=len(self.core.waiting),
            num_paused=sum(1 for s in seqs if s.status is Status.PAUSED),
            num_kv_tokens_used=self.core.kv_tokens_used(),
            num_kv_tokens_total=self.core.max_kv_tokens,
            output_tokens_per_s=sum(n for _, n in self._recent) / span,
            num_prefill_tokens=self.core.num_prefill_tokens,
            num_prefix_cache_hit_tokens=self.core.num_prefix_hit_tokens,
            num_output_tokens=self.core.num_output_tokens,
            model_fingerprint=self.core.layout.model_id,
        )
