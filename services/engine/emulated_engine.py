"""The emulated engine: the EngineBackend port served from a timing model, no accelerator (shell).

EMULATION ONLY: never routed to in place of a real engine's compute. It keeps the real
contract (generate, pause, export/import KV, resume, cancel, drain, weight updates, stats) and
the real lifecycle of each generation, but its tokens are scripted (`emulated_script`) and its
time is spent, not used: the decode loop wakes every `tick_s` of wall time, turns the elapsed
time times `time_scale` into modelled seconds, spends them on prefills first and then on decode
steps of the whole batch (`emulated_timing`), and hands each generation the tokens it earned.
It imports no torch, so hundreds fit in one process (`emulated_cells.py`).

A moved generation's "KV" is its token ids (4 bytes each): the receiving engine continues the
script exactly where it paused, and the modelled transfer time of the real cache
(`kv_bytes_per_token` over the link) is spent on import.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque

import structlog

from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from services.engine.emulated_kv import check_emulated_import, pack_ids
from services.engine.emulated_script import LOGPROB, reply_ids
from services.engine.emulated_stream import EmulatedEngineConfig, EmulatedStream
from services.engine.emulated_timing import EngineTiming, advance
from services.engine.kv_layout import ExportedKv, KvLayout, sha256_hex
from services.engine.port import DrainResult, EngineState, EngineStats, PausedGeneration, WeightsUpdate
from services.engine.sampling_params import Sampling, validate_sampling, validate_token_ids
from services.engine.sequence import Emission, Finish, Sequence, Status, common_prefix_len

log = structlog.get_logger(__name__)
FINISHED_KEPT = 1024


class EmulatedEngine:
    supports_kv_migration = True

    def __init__(self, config: EmulatedEngineConfig, timing: EngineTiming) -> None:
        self.config = config
        self.timing = timing
        self.engine_id = config.engine_id
        self.cell_id = config.cell_id
        self.version = config.policy_version
        self.state = EngineState.SERVING
        self.layout = KvLayout(
            model_id=config.model_id, dtype="emulated", num_layers=0, num_kv_heads=0, head_dim=0
        )
        self.seqs: dict[str, Sequence] = {}
        self._scripts: dict[str, list[int]] = {}
        self._prefill_left_s: dict[str, float] = {}
        self._waiting: deque[str] = deque()
        self._running: list[str] = []
        self._listeners: dict[str, set[EmulatedStream]] = {}
        self._paused_at: dict[str, float] = {}
        self._prefix: OrderedDict[str, tuple[int, ...]] = OrderedDict()
        self._finished: deque[str] = deque()
        """Finished generations, kept a while so a repeated request replays (bounded)."""
        self._carry = 0.0
        self._wake = asyncio.Event()
        self._recent: deque[tuple[float, int]] = deque()
        self._drain: tuple[str, DrainResult] | None = None
        self._answers: dict[str, object] = {}
        self.num_prefill_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_output_tokens = 0
        self.busy_s = 0.0
        """Wall seconds this engine's ticks took to compute (its own cost, for saturation)."""

    # --- the loop --------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            if not (self._waiting or self._running):
                self._wake.clear()
                waiter = asyncio.ensure_future(self._wake.wait())
                stopper = asyncio.ensure_future(stop.wait())
                await asyncio.wait({waiter, stopper}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                self._expire_paused()
                last = time.monotonic()
                continue
            await asyncio.sleep(self.config.tick_s)
            now = time.monotonic()
            self.tick((now - last) * self.config.time_scale)
            last = now
            self.busy_s += time.monotonic() - now

    def tick(self, budget_s: float) -> None:
        """Spend `budget_s` modelled seconds: admit, prefill in arrival order, then decode."""
        self._admit()
        for rid in list(self._running):
            left = self._prefill_left_s.get(rid, 0.0)
            if left <= 0.0:
                continue
            spent = min(left, budget_s)
            self._prefill_left_s[rid] = left - spent
            budget_s -= spent
            if budget_s <= 0.0:
                return
        decoding = [rid for rid in self._running if self._prefill_left_s.get(rid, 0.0) <= 0.0]
        if not decoding:
            return
        context = sum(self.seqs[rid].num_tokens for rid in decoding)
        steps, self._carry = advance(
            self.timing, budget_s=budget_s, batch=len(decoding), context_tokens=context, carry=self._carry
        )
        if steps:
            emitted = sum(self._decode(self.seqs[rid], steps) for rid in decoding)
            self._recent.append((time.monotonic(), emitted))
            self._trim_recent()

    def _admit(self) -> None:
        """Waiting generations join the batch while slots and KV capacity last (arrival order)."""
        used = self.kv_tokens_used()
        while self._waiting and len(self._running) < self.timing.max_num_seqs:
            seq = self.seqs[self._waiting[0]]
            if used + seq.num_tokens > self.timing.kv_capacity_tokens and self._running:
                return
            self._waiting.popleft()
            seq.status = Status.RUNNING
            self._running.append(seq.request_id)
            used += seq.num_tokens

    def _decode(self, seq: Sequence, steps: int) -> int:
        script = self._scripts[seq.request_id]
        start = len(seq.output_ids)
        finish: Finish | None = None
        for _ in range(steps):
            position = len(seq.output_ids)
            token = script[position] if position < len(script) else self.config.eos_id
            seq.output_ids.append(token)
            seq.output_logprobs.append(LOGPROB)
            seq.output_versions.append(self.version)
            if token == self.config.eos_id or token in seq.sampling.stop_ids:
                finish = Finish.STOP
            elif len(seq.output_ids) >= seq.sampling.max_tokens:
                finish = Finish.LENGTH
            elif seq.num_tokens >= self.config.max_context_tokens:
                finish = Finish.CONTEXT_LENGTH
            if finish is not None:
                break
        seq.num_cached = seq.num_tokens - 1
        self.num_output_tokens += len(seq.output_ids) - start
        if finish is not None:
            self._finish(seq, finish)
        self._dispatch(seq.emission_since(start, finish=finish))
        return len(seq.output_ids) - start

    def _finish(self, seq: Sequence, finish: Finish) -> None:
        seq.status, seq.finish = Status.FINISHED, finish
        self._leave_batch(seq.request_id)
        self._finished.append(seq.request_id)
        while len(self._finished) > FINISHED_KEPT:
            old = self._finished.popleft()
            if (gone := self.seqs.get(old)) is not None and gone.status is Status.FINISHED:
                del self.seqs[old]
                self._scripts.pop(old, None)
        self._prefix[seq.execution_id] = tuple(seq.token_ids)
        self._prefix.move_to_end(seq.execution_id)
        while len(self._prefix) > self.config.prefix_cache_executions:
            self._prefix.popitem(last=False)
        self._maybe_drained()

    def _leave_batch(self, request_id: str) -> None:
        if request_id in self._running:
            self._running.remove(request_id)
        if request_id in self._waiting:
            self._waiting.remove(request_id)
        self._prefill_left_s.pop(request_id, None)

    def _dispatch(self, e: Emission) -> None:
        if e.finish is Finish.PAUSED:
            self._paused_at[e.request_id] = time.time()
        for stream in self._listeners.get(e.request_id, ()):
            stream.queue.put_nowait(e)

    def _subscribe(self, seq: Sequence, replay: Emission | None) -> EmulatedStream:
        stream = EmulatedStream(
            self._unsubscribe, seq.request_id, len(seq.prompt_ids), seq.num_cached_prompt_tokens, replay
        )
        self._listeners.setdefault(seq.request_id, set()).add(stream)
        return stream

    def _unsubscribe(self, stream: EmulatedStream, finished: bool) -> None:
        listeners = self._listeners.get(stream.request_id, set())
        listeners.discard(stream)
        if listeners:
            return
        self._listeners.pop(stream.request_id, None)
        seq = self.seqs.get(stream.request_id)
        if not finished and seq is not None and seq.status in (Status.WAITING, Status.RUNNING):
            # The last reader went away mid-generation: nobody is served by it any more.
            self._cancel(seq)

    def _expire_paused(self) -> None:
        now = time.time()
        for rid in [r for r, t in self._paused_at.items() if now - t > self.config.paused_ttl_s]:
            seq = self.seqs.get(rid)
            if seq is not None and seq.status is Status.PAUSED:
                self._cancel(seq)
            self._paused_at.pop(rid, None)

    # --- generation ------------------------------------------------------------------------

    def _require_serving(self) -> None:
        if self.state in (EngineState.DRAINING, EngineState.DRAINED):
            raise Unavailable(f"engine {self.engine_id} is {self.state.value} and admits no generations")

    def _get(self, request_id: str) -> Sequence:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise NotFound(f"no generation {request_id!r} on engine {self.engine_id}")
        return seq

    async def generate(
        self, *, request_id: str, execution_id: str, prompt_ids: list[int], sampling: Sampling
    ) -> EmulatedStream:
        known = self.seqs.get(request_id)
        if known is not None:  # a repeated request: its stream from the start, nothing new runs
            ended = known.finish if known.status in (Status.FINISHED, Status.PAUSED) else None
            return self._subscribe(known, known.emission_since(0, finish=ended))
        self._require_serving()
        validate_sampling(sampling, vocab_size=self.config.vocab_size)
        validate_token_ids(prompt_ids, vocab_size=self.config.vocab_size, field="prompt_ids")
        if not prompt_ids:
            raise InvalidArgument("prompt_ids", "must hold at least one token")
        if len(prompt_ids) >= (limit := self.config.max_context_tokens):
            raise InvalidArgument(
                "prompt_ids", f"{len(prompt_ids)} tokens leave no room in the {limit}-token context"
            )
        seq = Sequence(
            request_id=request_id, execution_id=execution_id, prompt_ids=list(prompt_ids), sampling=sampling
        )
        cached = self._prefix.get(execution_id, ())
        hit = min(common_prefix_len(cached, prompt_ids), len(prompt_ids) - 1)
        seq.num_cached_prompt_tokens = hit
        self.num_prefix_hit_tokens += hit
        self.num_prefill_tokens += len(prompt_ids) - hit
        self.seqs[request_id] = seq
        self._scripts[request_id] = reply_ids(
            prompt_ids,
            length=self.config.reply_tokens,
            vocab_size=self.config.vocab_size,
            eos_id=self.config.eos_id,
        )
        self._prefill_left_s[request_id] = self.timing.prefill_s(len(prompt_ids) - hit)
        self._waiting.append(request_id)
        stream = self._subscribe(seq, None)
        self._wake.set()
        return stream

    async def resume(self, request_id: str) -> EmulatedStream:
        seq = self._get(request_id)
        if seq.status is Status.PAUSED:
            self._require_serving()
            seq.status, seq.finish, seq.stream_start = Status.WAITING, None, len(seq.output_ids)
            self._waiting.append(request_id)  # its cache is held: no prefill
            self._paused_at.pop(request_id, None)
            self._wake.set()
        replay = None
        if len(seq.output_ids) > seq.stream_start or seq.status is Status.FINISHED:
            ended = seq.finish if seq.status is Status.FINISHED else None
            replay = seq.emission_since(seq.stream_start, finish=ended)
        return self._subscribe(seq, replay)

    def _paused_answer(self, seq: Sequence) -> PausedGeneration:
        return PausedGeneration(
            request_id=seq.request_id,
            output=seq.emission_since(0, finish=Finish.PAUSED),
            num_cached_tokens=seq.num_cached,
            kv_size_bytes=self.timing.kv_bytes(seq.num_cached),
            layout=self.layout,
            expires_at_s=self._paused_at.get(seq.request_id, time.time()) + self.config.paused_ttl_s,
        )

    def _pause(self, seq: Sequence) -> None:
        if seq.status in (Status.WAITING, Status.RUNNING):
            self._leave_batch(seq.request_id)
            seq.status, seq.finish = Status.PAUSED, Finish.PAUSED
            seq.num_cached = seq.num_tokens - 1 if seq.output_ids else seq.num_cached_prompt_tokens
            self._dispatch(Emission(request_id=seq.request_id, finish=Finish.PAUSED))

    async def pause(self, request_id: str) -> PausedGeneration:
        seq = self._get(request_id)
        if seq.status is Status.FINISHED:
            raise Conflict(f"generation {request_id!r} has finished; there is nothing to pause")
        self._pause(seq)
        return self._paused_answer(seq)

    def _cancel(self, seq: Sequence) -> int:
        freed = self.timing.kv_bytes(seq.num_tokens) if seq.status is not Status.FINISHED else 0
        was_live = seq.status in (Status.WAITING, Status.RUNNING)
        self._leave_batch(seq.request_id)
        self.seqs.pop(seq.request_id, None)
        self._scripts.pop(seq.request_id, None)
        self._paused_at.pop(seq.request_id, None)
        if was_live:
            self._dispatch(Emission(request_id=seq.request_id, finish=Finish.CANCELLED))
        self._maybe_drained()
        return freed

    async def cancel(self, request_id: str) -> int:
        return self._cancel(self._get(request_id))

    # --- migration -------------------------------------------------------------------------

    async def export_kv(self, request_id: str) -> tuple[ExportedKv, bytes]:
        seq = self._get(request_id)
        if seq.status is not Status.PAUSED:
            raise Conflict(f"generation {request_id!r} is {seq.status.value}; pause it before exporting")
        data = pack_ids(seq.token_ids[: seq.num_cached])
        header = ExportedKv(
            request_id=seq.request_id,
            execution_id=seq.execution_id,
            token_ids=tuple(seq.token_ids),
            num_prompt_tokens=len(seq.prompt_ids),
            num_cached_tokens=seq.num_cached,
            output_logprobs=tuple(seq.output_logprobs),
            output_versions=tuple(seq.output_versions),
            sampling=seq.sampling,
            layout=self.layout,
            size_bytes=len(data),
            sha256=sha256_hex(data),
        )
        return header, data

    async def import_kv(self, header: ExportedKv, data: bytes) -> PausedGeneration:
        known = self.seqs.get(header.request_id)
        if known is not None and known.status is Status.PAUSED:
            return self._paused_answer(known)  # a repeated import
        self._require_serving()
        check_emulated_import(header, data, model_id=self.layout.model_id)
        prompt = list(header.token_ids[: header.num_prompt_tokens])
        seq = Sequence(
            request_id=header.request_id,
            execution_id=header.execution_id,
            prompt_ids=prompt,
            sampling=header.sampling,
            output_ids=list(header.token_ids[header.num_prompt_tokens :]),
            output_logprobs=list(header.output_logprobs),
            output_versions=list(header.output_versions),
            status=Status.PAUSED,
            finish=Finish.PAUSED,
            num_cached=header.num_cached_tokens,
            num_cached_prompt_tokens=min(header.num_cached_tokens, len(prompt)),
        )
        # What the real cache would take to cross the link; the script continues where it paused.
        await asyncio.sleep(self.timing.kv_move_s(header.num_cached_tokens) / self.config.time_scale)
        self.seqs[seq.request_id] = seq
        self._scripts[seq.request_id] = reply_ids(
            prompt,
            length=self.config.reply_tokens,
            vocab_size=self.config.vocab_size,
            eos_id=self.config.eos_id,
        )
        self._paused_at[seq.request_id] = time.time()
        return self._paused_answer(seq)

    # --- drain, weights, stats -------------------------------------------------------------

    async def drain(self, *, request_id: str, pause_in_flight: bool, release_memory: bool) -> DrainResult:
        first = self._answers.get(request_id)
        if isinstance(first, DrainResult):
            return first
        if self.state not in (EngineState.DRAINING, EngineState.DRAINED):
            self.state = EngineState.DRAINING
        paused: list[str] = []
        if pause_in_flight:
            for rid in [*self._running, *self._waiting]:
                self._pause(self.seqs[rid])
                paused.append(rid)
        result = DrainResult(
            paused_request_ids=tuple(paused),
            num_running=len(self._running) + len(self._waiting),
            state=self.state,
        )
        self._drain = (request_id, result)
        self._maybe_drained()
        result = DrainResult(
            paused_request_ids=result.paused_request_ids, num_running=result.num_running, state=self.state
        )
        self._answers[request_id] = result
        return result

    def _maybe_drained(self) -> None:
        if self.state is not EngineState.DRAINING or self._drain is None:
            return
        if self._running or self._waiting or any(s.status is Status.PAUSED for s in self.seqs.values()):
            return
        self.state = EngineState.DRAINED
        log.info("engine_drained", engine_id=self.engine_id, emulated=True)

    async def update_weights(
        self, *, request_id: str, version: int, source_uri: str, sha256: str
    ) -> WeightsUpdate:
        first = self._answers.get(request_id)
        if isinstance(first, WeightsUpdate):
            return first
        previous = self.version
        if version < previous:
            raise Conflict(f"version {version} is older than the loaded version {previous}")
        duration_s = 0.0
        if version != previous or self.state is EngineState.DRAINED:
            state_before, self.state = self.state, EngineState.UPDATING_WEIGHTS
            duration_s = self.timing.weight_load_s() / self.config.time_scale
            try:
                await asyncio.sleep(duration_s)  # the modelled load; decode ticks wait for nothing here
            finally:
                self.state = EngineState.SERVING if state_before is EngineState.DRAINED else state_before
            self.version = version
            if self.state is EngineState.SERVING:
                self._drain = None
        update = WeightsUpdate(
            previous_version=previous,
            version=version,
            duration_s=duration_s,
            num_generations_continued=len(self._running) + len(self._waiting),
        )
        self._answers[request_id] = update
        return update

    def kv_tokens_used(self) -> int:
        return sum(s.num_tokens for s in self.seqs.values() if s.status is not Status.FINISHED)

    def _trim_recent(self) -> None:
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > 10.0:
            self._recent.popleft()

    def stats(self) -> EngineStats:
        self._trim_recent()
        span = max(time.monotonic() - self._recent[0][0], 1e-3) if self._recent else 1.0
        return EngineStats(
            engine_id=self.engine_id,
            cell_id=self.cell_id,
            state=self.state,
            policy_version=self.version,
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            num_paused=sum(1 for s in self.seqs.values() if s.status is Status.PAUSED),
            num_kv_tokens_used=self.kv_tokens_used(),
            num_kv_tokens_total=self.timing.kv_capacity_tokens,
            output_tokens_per_s=sum(n for _, n in self._recent) / span,
            num_prefill_tokens=self.num_prefill_tokens,
            num_prefix_cache_hit_tokens=self.num_prefix_hit_tokens,
            num_output_tokens=self.num_output_tokens,
            model_fingerprint=self.layout.model_id,
        )
