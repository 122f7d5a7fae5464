"""The vLLM adapter: the engine port served by vLLM on GPU cells (shell; needs the `[vllm]` extra).

Imported only when `GYRE_ENGINE_ADAPTER=vllm`; nothing else in Gyre imports vllm. What maps how:

- Generate: `AsyncLLM.generate` with `prompt_token_ids`, `SamplingParams(logprobs=0)` (vLLM returns
  the raw model logprob of each sampled token, matching the torch engine) and the request's seed.
  vLLM batches continuously and reuses shared prefixes (automatic prefix caching) on its own.
- Pause / Resume (same engine): abort at a token boundary and keep the output; Resume submits
  prompt + output again and vLLM's prefix cache makes that prefill nearly free.
- ExportKV / ImportKV: cross-engine KV moves go through vLLM's KV-connector API with NIXL (or the
  Mooncake Transfer Engine) over RDMA, configured with `--kv-transfer-config`. That path is not
  wired in this build, so both answer UNAVAILABLE and the contract suite skips migration for this
  adapter (`supports_kv_migration = False`), never fakes it.
- UpdateWeights: the workers load `model.safetensors` through `collective_rpc` into the live model
  (`model.load_weights`), then the prefix cache is reset.

The contract suite runs against this adapter wherever CUDA and vllm are present.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from services.engine.config import EngineSettings
from services.engine.kv import ExportedKv, KvLayout
from services.engine.port import DrainResult, EngineState, EngineStats, PausedGeneration, WeightsUpdate
from services.engine.sampling import Sampling, validate_sampling, validate_token_ids
from services.engine.sequence import Emission, Finish
from services.engine.weights import is_adapter_source, read_adapter_update, weights_path

NO_KV_MOVES = "KV migration with vLLM needs the NIXL KV connector, which this build does not wire"


@dataclass(slots=True, kw_only=True)
class _Gen:
    request_id: str
    prompt_ids: list[int]
    sampling: Sampling
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    finish: Finish | None = None
    paused: bool = False
    segment: int = 0


@dataclass(slots=True, kw_only=True)
class _VllmStream:
    num_prompt_tokens: int
    num_cached_prompt_tokens: int
    source: AsyncIterator[Emission]

    def __aiter__(self) -> AsyncIterator[Emission]:
        return self.source


class VllmEngine:
    supports_kv_migration = False

    def __init__(self, settings: EngineSettings) -> None:
        from transformers import AutoConfig
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.settings = settings
        self.engine_id = settings.engine_id
        self.version = settings.policy_version
        self._lora_base = ""
        """Which LoRA base (and adapted layers) the workers hold under the merged adapter; "" none."""
        self.state = EngineState.SERVING
        config = AutoConfig.from_pretrained(settings.model_dir)
        self.vocab_size = int(config.vocab_size)
        self.max_context = int(config.max_position_embeddings)
        self.eos_ids = frozenset([config.eos_token_id] if isinstance(config.eos_token_id, int) else [])
        self.llm: Any = AsyncLLM.from_engine_args(
            AsyncEngineArgs(model=str(settings.model_dir), enable_prefix_caching=True, seed=0)
        )
        self.gens: dict[str, _Gen] = {}
        self.layout = KvLayout(
            model_id=f"vllm-{config.model_type}",
            dtype="bfloat16",
            num_layers=int(config.num_hidden_layers),
            num_kv_heads=int(config.num_key_value_heads),
            head_dim=int(getattr(config, "head_dim", 0) or config.hidden_size // config.num_attention_heads),
        )
        self.num_output_tokens = 0

    async def run(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.llm.shutdown()

    def _params(self, gen: _Gen) -> Any:
        from vllm import SamplingParams

        s = gen.sampling
        return SamplingParams(
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_tokens - len(gen.output_ids),
            stop_token_ids=sorted(s.stop_ids | self.eos_ids),
            seed=s.seed,
            logprobs=0,
        )

    async def _follow(self, gen: _Gen) -> AsyncIterator[Emission]:
        gen.segment += 1
        segment, base = gen.segment, len(gen.output_ids)
        vllm_id = f"{gen.request_id}#{segment}"
        prompt = {"prompt_token_ids": gen.prompt_ids + gen.output_ids}
        async for out in self.llm.generate(prompt, self._params(gen), vllm_id):
            if gen.segment != segment:
                return
            completion = out.outputs[0]
            new_ids = list(completion.token_ids)[len(gen.output_ids) - base :]
            new_lps = [
                float(completion.logprobs[len(gen.output_ids) - base + i][t].logprob)
                for i, t in enumerate(new_ids)
            ]
            gen.output_ids += new_ids
            gen.logprobs += new_lps
            gen.versions += [self.version] * len(new_ids)
            self.num_output_tokens += len(new_ids)
            finish = None
            if completion.finish_reason is not None:
                finish = Finish.LENGTH if completion.finish_reason == "length" else Finish.STOP
                gen.finish = finish
            yield Emission(
                request_id=gen.request_id,
                token_ids=tuple(new_ids),
                logprobs=tuple(new_lps),
                policy_versions=(self.version,) * len(new_ids),
                finish=finish,
            )
            if finish is not None:
                return
        if gen.paused:
            yield Emission(request_id=gen.request_id, finish=Finish.PAUSED)

    async def generate(
        self, *, request_id: str, execution_id: str, prompt_ids: list[int], sampling: Sampling
    ) -> _VllmStream:
        if self.state is not EngineState.SERVING:
            raise Unavailable(f"engine {self.engine_id} is {self.state.value}")
        if request_id in self.gens:
            raise Conflict(f"generation {request_id!r} exists; the vLLM adapter does not replay streams")
        if not prompt_ids:
            raise InvalidArgument("prompt_ids", "must hold at least one token id")
        validate_token_ids(prompt_ids, vocab_size=self.vocab_size, field="prompt_ids")
        if len(prompt_ids) >= self.max_context:
            raise InvalidArgument(
                "prompt_ids", f"{len(prompt_ids)} tokens fill the {self.max_context} context"
            )
        validate_sampling(sampling, vocab_size=self.vocab_size)
        gen = _Gen(request_id=request_id, prompt_ids=list(prompt_ids), sampling=sampling)
        self.gens[request_id] = gen
        return _VllmStream(
            num_prompt_tokens=len(prompt_ids), num_cached_prompt_tokens=0, source=self._follow(gen)
        )

    def _get(self, request_id: str) -> _Gen:
        if request_id not in self.gens:
            raise NotFound(f"no generation {request_id!r} on engine {self.engine_id}")
        return self.gens[request_id]

    async def pause(self, request_id: str) -> PausedGeneration:
        gen = self._get(request_id)
        if gen.finish is not None:
            raise Conflict(f"generation {request_id!r} already finished")
        if not gen.paused:
            gen.paused = True
            await self.llm.abort(f"{request_id}#{gen.segment}")
        return PausedGeneration(
            request_id=request_id,
            output=Emission(
                request_id=request_id,
                token_ids=tuple(gen.output_ids),
                logprobs=tuple(gen.logprobs),
                policy_versions=tuple(gen.versions),
                finish=Finish.PAUSED,
            ),
            num_cached_tokens=0,
            kv_size_bytes=0,
            layout=self.layout,
            expires_at_s=time.time() + self.settings.paused_ttl_s,
        )

    async def export_kv(self, request_id: str) -> tuple[ExportedKv, bytes]:
        self._get(request_id)
        raise Unavailable(NO_KV_MOVES)

    async def import_kv(self, header: ExportedKv, data: bytes) -> PausedGeneration:
        raise Unavailable(NO_KV_MOVES)

    async def resume(self, request_id: str) -> _VllmStream:
        gen = self._get(request_id)
        if not gen.paused:
            raise Conflict(f"generation {request_id!r} is not paused")
        gen.paused = False
        return _VllmStream(
            num_prompt_tokens=len(gen.prompt_ids), num_cached_prompt_tokens=0, source=self._follow(gen)
        )

    async def cancel(self, request_id: str) -> int:
        gen = self._get(request_id)
        gen.segment += 1
        gen.finish = gen.finish or Finish.CANCELLED
        await self.llm.abort(f"{request_id}#{gen.segment - 1}")
        return 0

    async def drain(self, *, request_id: str, pause_in_flight: bool, release_memory: bool) -> DrainResult:
        self.state = EngineState.DRAINING
        paused = []
        if pause_in_flight:
            for rid, gen in self.gens.items():
                if gen.finish is None and not gen.paused:
                    await self.pause(rid)
                    paused.append(rid)
        running = sum(1 for g in self.gens.values() if g.finish is None and not g.paused)
        if running == 0:
            self.state = EngineState.DRAINED
            if release_memory:
                await self.llm.sleep(level=1)
        return DrainResult(paused_request_ids=tuple(paused), num_running=running, state=self.state)

    def stats(self) -> EngineStats:
        live = [g for g in self.gens.values() if g.finish is None]
        return EngineStats(
            engine_id=self.engine_id,
            cell_id=self.settings.cell_id,
            state=self.state,
            policy_version=self.version,
            num_running=sum(1 for g in live if not g.paused),
            num_waiting=0,
            num_paused=sum(1 for g in live if g.paused),
            num_kv_tokens_used=0,
            num_kv_tokens_total=0,
            output_tokens_per_s=0.0,
            num_prefill_tokens=0,
            num_prefix_cache_hit_tokens=0,
            num_output_tokens=self.num_output_tokens,
        )

    async def update_weights(
        self, *, request_id: str, version: int, source_uri: str, sha256: str
    ) -> WeightsUpdate:
        started = time.perf_counter()
        # A LoRA version is merged into its base on the host (as the torch engine does) and the
        # adapted layers' merged weights are loaded; the base in full only when not held already.
        # Written to the same contract as the torch engine's, not yet run on a GPU.
        adapter = (
            await asyncio.to_thread(read_adapter_update, None, source_uri, sha256=sha256)
            if is_adapter_source(source_uri)
            else None
        )
        path = "" if adapter is not None else str(weights_path(source_uri))
        if adapter is not None and adapter.mark != self._lora_base:
            path = str(weights_path(adapter.base_uri))
        merged = list(adapter.merged.items()) if adapter is not None else []
        if self.state is EngineState.DRAINED:
            await self.llm.wake_up()

        def load(worker: Any) -> None:
            from safetensors.torch import load_file

            if path:
                worker.model_runner.model.load_weights(weights=list(load_file(path).items()))
            if merged:
                worker.model_runner.model.load_weights(weights=merged)

        await self.llm.collective_rpc(load)
        self._lora_base = adapter.mark if adapter is not None else ""
        await self.llm.reset_prefix_cache()
        previous, self.version, self.state = self.version, version, EngineState.SERVING
        return WeightsUpdate(
            previous_version=previous,
            version=version,
            duration_s=time.perf_counter() - started,
            num_generations_continued=sum(1 for g in self.gens.values() if g.finish is None),
        )
