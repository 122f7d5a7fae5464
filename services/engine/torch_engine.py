"""The torch reference engine: continuous batching, prefix reuse, pause/export/import, weight swap.

Synchronous and single-threaded by contract: `EngineLoop` (loop.py) calls one method at a time,
between decode steps, so no method needs a lock. Works with any Hugging Face causal LM folder
whose attention honours 4-D boolean masks and per-row position ids (Qwen2, Llama, ...).

Prefill: at most `prefill_chunk_tokens` prompt tokens per step (`_prefill_some`), so a long prompt
is cached over several steps while the running sequences decode in each; its attention runs on
CPU flash kernels without a mask (attention.py), not transformers' masked SDPA path.

Decode batching: running sequences share one left-padded DynamicCache; each row's padding is
masked out and its position ids are its own, so rows of different lengths decode together. The
padded batch is rebuilt only when membership changes (a sequence joins or leaves), so a steady
batch just grows by one position per step.

Legend: B batch rows, T tokens, L cache length, H KV heads, D head size, V vocabulary.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache
from transformers.cache_utils import DynamicLayer

from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from services.engine.attention import NAME as PREFILL_ATTENTION
from services.engine.kv import (
    ExportedKv,
    KvLayout,
    LayerKV,
    check_import,
    deserialize_kv,
    serialize_kv,
    sha256_hex,
)
from services.engine.sampling import Sampling, choose_token, validate_sampling, validate_token_ids
from services.engine.sequence import (
    Emission,
    Finish,
    Sequence,
    Status,
    common_prefix_len,
    finish_after,
)
from services.engine.weights import apply_adapter_source, is_adapter_source, load_weight_source

MAX_FINISHED_KEPT = 4096
"""Finished generations remembered so a repeated request replays instead of starting over."""


@dataclass(slots=True, kw_only=True)
class _Batch:
    ids: tuple[str, ...]
    cache: DynamicCache
    pads: list[int]
    length: int


@dataclass(frozen=True, slots=True, kw_only=True)
class _PrefixEntry:
    token_ids: tuple[int, ...]
    kv: list[LayerKV]


def model_fingerprint(model_dir: Path) -> str:
    """Names a checkpoint: its config and the first MiB of each weight file, so two random inits differ."""
    digest = hashlib.sha256((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        with path.open("rb") as f:
            digest.update(f.read(1 << 20))
    return digest.hexdigest()[:16]


def cache_from(layers: list[LayerKV] | None) -> DynamicCache:
    cache = DynamicCache()
    for i, (keys_HTD, values_HTD) in enumerate(layers or []):
        cache.update(keys_HTD.unsqueeze(0), values_HTD.unsqueeze(0), i)
    return cache


def layers_of(
    cache: DynamicCache, *, row: int = 0, start: int = 0, end: int | None = None, clone: bool = True
) -> list[LayerKV]:
    """One row's per-layer (keys, values), positions [start, end): independent tensors, or views
    of the cache's (`clone=False`, for a cache that is dropped right after)."""
    return [
        (layer.keys[row, :, start:end], layer.values[row, :, start:end])  # type: ignore[index]
        if not clone
        else (layer.keys[row, :, start:end].clone(), layer.values[row, :, start:end].clone())  # type: ignore[index]
        for layer in cache.layers
        if isinstance(layer, DynamicLayer) and layer.keys is not None and layer.keys.numel() > 0
    ]


def kv_bytes(layers: list[LayerKV] | None) -> int:
    return sum(k.numel() * k.element_size() * 2 for k, _ in layers or [])


class TorchEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        engine_id: str,
        policy_version: int = 0,
        max_batch: int = 32,
        prefill_chunk_tokens: int = 2048,
        prefix_cache_max_tokens: int = 65536,
        max_kv_tokens: int = 1 << 20,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.engine_id = engine_id
        self.config: Any = AutoConfig.from_pretrained(self.model_dir)
        self.model: Any = self._load_model()
        self._lora_base = ""
        """Which LoRA base (and adapted layers) the model holds under its merged adapter; "" none."""
        self.version = policy_version
        self.max_batch = max_batch
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.prefix_cache_max_tokens = prefix_cache_max_tokens
        self.max_kv_tokens = max_kv_tokens
        self.vocab_size = int(self.config.vocab_size)
        self.max_context = int(self.config.max_position_embeddings)
        eos = self.model.generation_config.eos_token_id or self.config.eos_token_id
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        head_dim = getattr(self.config, "head_dim", None) or (
            self.config.hidden_size // self.config.num_attention_heads
        )
        self.layout = KvLayout(
            model_id=f"{self.config.model_type}-{model_fingerprint(self.model_dir)}",
            dtype=str(self.model.dtype).removeprefix("torch."),
            num_layers=int(self.config.num_hidden_layers),
            num_kv_heads=int(self.config.num_key_value_heads),
            head_dim=int(head_dim),
        )
        self.seqs: OrderedDict[str, Sequence] = OrderedDict()
        self.waiting: list[str] = []
        self.running: list[str] = []
        self._batch: _Batch | None = None
        self._prefix: OrderedDict[str, _PrefixEntry] = OrderedDict()
        self.num_prefill_tokens = 0
        self.num_prefix_hit_tokens = 0
        self.num_output_tokens = 0

    def _load_model(self) -> Any:
        return AutoModelForCausalLM.from_pretrained(
            self.model_dir, dtype=torch.float32, attn_implementation=PREFILL_ATTENTION
        ).eval()  # type: ignore[no-untyped-call]

    # --- admission -------------------------------------------------------------------------

    def submit(
        self, *, request_id: str, execution_id: str, prompt_ids: list[int], sampling: Sampling
    ) -> Sequence:
        """Admit a generation; a known request id returns the existing one (the caller replays it)."""
        if self.model is None:
            raise Unavailable("engine released its memory after a drain; UpdateWeights reloads it")
        if request_id in self.seqs:
            return self.seqs[request_id]
        if not prompt_ids:
            raise InvalidArgument("prompt_ids", "must hold at least one token id")
        validate_token_ids(prompt_ids, vocab_size=self.vocab_size, field="prompt_ids")
        if len(prompt_ids) >= self.max_context:
            raise InvalidArgument(
                "prompt_ids",
                f"{len(prompt_ids)} tokens leave no room in the model's {self.max_context}-token context",
            )
        validate_sampling(sampling, vocab_size=self.vocab_size)
        if sampling.seed is None:
            sampling = replace(sampling, seed=int.from_bytes(os.urandom(7), "big"))
        seq = Sequence(
            request_id=request_id, execution_id=execution_id, prompt_ids=list(prompt_ids), sampling=sampling
        )
        self._take_prefix(seq)
        self.seqs[request_id] = seq
        self.waiting.append(request_id)
        return seq

    def _take_prefix(self, seq: Sequence) -> None:
        entry = self._prefix.get(seq.execution_id) if seq.execution_id else None
        if entry is None:
            return
        # At least the last prompt token is left for the first decode step to read.
        n = min(common_prefix_len(entry.token_ids, seq.prompt_ids), len(seq.prompt_ids) - 1)
        if n <= 0:
            return
        seq.kv = [(k[:, :n].clone(), v[:, :n].clone()) for k, v in entry.kv]
        seq.num_cached = seq.num_cached_prompt_tokens = n
        self.num_prefix_hit_tokens += n
        self._prefix.move_to_end(seq.execution_id)

    def _store_prefix(self, seq: Sequence) -> None:
        if not seq.execution_id or seq.kv is None or seq.num_cached == 0:
            return
        self._prefix[seq.execution_id] = _PrefixEntry(
            token_ids=tuple(seq.token_ids[: seq.num_cached]), kv=seq.kv
        )
        self._prefix.move_to_end(seq.execution_id)
        while sum(len(e.token_ids) for e in self._prefix.values()) > self.prefix_cache_max_tokens:
            self._prefix.popitem(last=False)

    # --- the step --------------------------------------------------------------------------

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @torch.inference_mode()
    def step(self) -> list[Emission]:
        """Prefill at most one chunk of waiting prompts, then decode one token for every running one.

        A long prompt takes several steps to prefill, and the running sequences decode a token in
        each of them: no prompt stalls the batch for its whole prefill, and a pause, a cancel or a
        drain lands between two chunks (the loop calls `step` once per lock hold).
        """
        self._prefill_some()
        if not self.running:
            return []
        batch = self._ensure_batch()
        seqs = [self.seqs[i] for i in batch.ids]
        input_ids_B1 = torch.tensor([[s.token_ids[-1]] for s in seqs])
        position_ids_B1 = torch.tensor([[s.num_cached] for s in seqs])
        pads_B = torch.tensor(batch.pads)
        mask_BL = torch.arange(batch.length + 1)[None, :] >= pads_B[:, None]
        out = self.model(
            input_ids=input_ids_B1,
            cache=batch.cache,
            attention_mask=mask_BL[:, None, None, :],
            position_ids=position_ids_B1,
            use_cache=True,
            logits_to_keep=1,
        )
        batch.length += 1
        logits_BV = out.logits[:, -1]
        emissions: list[Emission] = []
        for row, seq in enumerate(seqs):
            seq.num_cached += 1
            generator = torch.Generator().manual_seed(_token_seed(seq))
            token, logprob = choose_token(logits_BV[row], seq.sampling, generator)
            seq.output_ids.append(token)
            seq.output_logprobs.append(logprob)
            seq.output_versions.append(self.version)
            self.num_output_tokens += 1
            finish = finish_after(seq, token, eos_ids=self.eos_ids, max_context=self.max_context)
            emissions.append(
                Emission(
                    request_id=seq.request_id,
                    token_ids=(token,),
                    logprobs=(logprob,),
                    policy_versions=(self.version,),
                    finish=finish,
                )
            )
            if finish is not None:
                self._leave_batch(seq, Status.FINISHED, finish)
                self._store_prefix(seq)
        if any(e.finish is not None for e in emissions):
            self._forget_old()
        return emissions

    def _prefill_some(self) -> None:
        """Spend up to `prefill_chunk_tokens` on waiting prompts, oldest first; a sequence whose
        prompt is all cached (every token but the last) joins the decode batch."""
        budget = self.prefill_chunk_tokens
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.seqs[self.waiting[0]]
            if budget > 0:
                budget -= self._prefill(seq, max_tokens=budget)
            if seq.num_cached < seq.num_tokens - 1:
                return  # the budget ran out inside this prompt: it continues next step
            self.waiting.pop(0)
            seq.status = Status.RUNNING
            self.running.append(seq.request_id)

    def _prefill(self, seq: Sequence, *, max_tokens: int) -> int:
        """Cache up to `max_tokens` more of every token but the last (the first decode step's
        input), after what is cached; returns how many it cached."""
        start, end = seq.num_cached, min(seq.num_tokens - 1, seq.num_cached + max_tokens)
        if end <= start:
            return 0
        cache = cache_from(seq.kv)
        self.model(
            input_ids=torch.tensor([seq.token_ids[start:end]]),
            cache=cache,
            position_ids=torch.arange(start, end)[None, :],
            use_cache=True,
            logits_to_keep=1,
        )
        self.num_prefill_tokens += end - start
        seq.kv = layers_of(cache, clone=False)  # the chunk's cache is dropped here: no copy
        seq.num_cached = end
        return end - start

    def _ensure_batch(self) -> _Batch:
        ids = tuple(self.running)
        if self._batch is not None and self._batch.ids == ids:
            return self._batch
        self._unbatch()
        seqs = [self.seqs[i] for i in ids]
        length = max(s.num_cached for s in seqs)
        pads = [length - s.num_cached for s in seqs]
        cache = DynamicCache()
        for layer in range(self.layout.num_layers):
            shape = (len(seqs), self.layout.num_kv_heads, length, self.layout.head_dim)
            keys_BHLD = torch.zeros(shape, dtype=self.model.dtype)
            values_BHLD = torch.zeros(shape, dtype=self.model.dtype)
            for row, s in enumerate(seqs):
                if s.kv is not None and s.num_cached > 0:
                    keys_BHLD[row, :, pads[row] :] = s.kv[layer][0]
                    values_BHLD[row, :, pads[row] :] = s.kv[layer][1]
            cache.update(keys_BHLD, values_BHLD, layer)
        for s in seqs:
            s.kv = None  # the batch holds it now
        self._batch = _Batch(ids=ids, cache=cache, pads=pads, length=length)
        return self._batch

    def _unbatch(self) -> None:
        """Give every row of the current batch its own cache back."""
        batch, self._batch = self._batch, None
        if batch is None:
            return
        for row, rid in enumerate(batch.ids):
            seq = self.seqs.get(rid)
            if seq is not None and seq.kv is None and seq.num_cached > 0:
                seq.kv = layers_of(batch.cache, row=row, start=batch.pads[row])

    def _leave_batch(self, seq: Sequence, status: Status, finish: Finish | None) -> None:
        if seq.request_id in self.running:
            assert self._batch is not None
            row = self._batch.ids.index(seq.request_id)
            seq.kv = layers_of(self._batch.cache, row=row, start=self._batch.pads[row])
            self.running.remove(seq.request_id)
        if seq.request_id in self.waiting:
            self.waiting.remove(seq.request_id)
        seq.status = status
        seq.finish = finish

    def _forget_old(self) -> None:
        finished = [r for r, s in self.seqs.items() if s.status is Status.FINISHED]
        for rid in finished[: max(0, len(finished) - MAX_FINISHED_KEPT)]:
            del self.seqs[rid]

    # --- migration primitives --------------------------------------------------------------

    def get(self, request_id: str) -> Sequence:
        seq = self.seqs.get(request_id)
        if seq is None:
            raise NotFound(f"no generation {request_id!r} on engine {self.engine_id}")
        return seq

    def pause(self, request_id: str) -> Sequence:
        """Stop at a token boundary, keeping the KV; pausing a paused generation is a no-op."""
        seq = self.get(request_id)
        if seq.status is Status.FINISHED:
            raise Conflict(
                f"generation {request_id!r} already finished ({seq.finish.value if seq.finish else ''})"
            )
        if seq.status is not Status.PAUSED:
            self._leave_batch(seq, Status.PAUSED, Finish.PAUSED)
        return seq

    def resume(self, request_id: str) -> Sequence:
        seq = self.get(request_id)
        if seq.status is Status.PAUSED:
            if self.model is None:
                raise Unavailable("engine released its memory after a drain; UpdateWeights reloads it")
            seq.status, seq.finish = Status.WAITING, None
            seq.stream_start = len(seq.output_ids)
            self.waiting.append(request_id)
        return seq

    def cancel(self, request_id: str) -> int:
        """Drop a generation and free its cache; returns the bytes freed (0 for a repeat)."""
        seq = self.get(request_id)
        if seq.status is not Status.FINISHED:
            self._leave_batch(seq, Status.FINISHED, Finish.CANCELLED)
        freed = kv_bytes(seq.kv)
        seq.kv, seq.num_cached = None, 0
        self._forget_old()
        return freed

    def export_kv(self, request_id: str) -> tuple[ExportedKv, bytes]:
        seq = self.get(request_id)
        if seq.status is not Status.PAUSED:
            raise Conflict(f"generation {request_id!r} is {seq.status.value}; pause it before exporting")
        data = serialize_kv(seq.kv or [])
        header = ExportedKv(
            request_id=seq.request_id,
            execution_id=seq.execution_id,
            token_ids=tuple(seq.token_ids),
            num_prompt_tokens=len(seq.prompt_ids),
            num_cached_tokens=seq.num_cached if seq.kv else 0,
            output_logprobs=tuple(seq.output_logprobs),
            output_versions=tuple(seq.output_versions),
            sampling=seq.sampling,
            layout=self.layout,
            size_bytes=len(data),
            sha256=sha256_hex(data),
        )
        return header, data

    def import_kv(self, header: ExportedKv, data: bytes) -> Sequence:
        """Hold another engine's paused generation here, ready to resume; checks everything first."""
        existing = self.seqs.get(header.request_id)
        if existing is not None:
            if existing.status is Status.PAUSED and tuple(existing.token_ids) == header.token_ids:
                return existing
            raise Conflict(f"generation {header.request_id!r} already exists here ({existing.status.value})")
        token_ids = list(header.token_ids)
        validate_token_ids(token_ids, vocab_size=self.vocab_size, field="header.token_ids")
        if not 1 <= header.num_prompt_tokens <= len(token_ids):
            raise InvalidArgument(
                "header.num_prompt_tokens",
                f"must be in [1, {len(token_ids)}], got {header.num_prompt_tokens}",
            )
        num_output = len(token_ids) - header.num_prompt_tokens
        if len(header.output_logprobs) != num_output or len(header.output_versions) != num_output:
            raise InvalidArgument(
                "header.output", f"must carry logprobs and versions for {num_output} tokens"
            )
        if len(token_ids) >= self.max_context:
            raise InvalidArgument(
                "header.token_ids", f"{len(token_ids)} tokens fill the {self.max_context} context"
            )
        validate_sampling(header.sampling, vocab_size=self.vocab_size, field="header.sampling")
        check_import(
            mine=self.layout,
            theirs=header.layout,
            num_cached_tokens=header.num_cached_tokens,
            num_token_ids=len(token_ids) - 1,
            declared_size_bytes=header.size_bytes,
            declared_sha256=header.sha256,
            data=data,
        )
        kv = deserialize_kv(data, layout=self.layout, num_tokens=header.num_cached_tokens)
        seq = Sequence(
            request_id=header.request_id,
            execution_id=header.execution_id,
            prompt_ids=token_ids[: header.num_prompt_tokens],
            sampling=header.sampling,
            output_ids=token_ids[header.num_prompt_tokens :],
            output_logprobs=list(header.output_logprobs),
            output_versions=list(header.output_versions),
            status=Status.PAUSED,
            finish=Finish.PAUSED,
            kv=kv if header.num_cached_tokens else None,
            num_cached=header.num_cached_tokens,
            num_cached_prompt_tokens=min(header.num_cached_tokens, header.num_prompt_tokens),
        )
        self.seqs[seq.request_id] = seq
        return seq

    # --- weights and memory ----------------------------------------------------------------

    def update_weights(self, *, version: int, source_uri: str, sha256: str = "") -> None:
        """Copy a published state dict into the model in place; all checks pass before any copy."""
        if self.model is None:
            self.model = AutoModelForCausalLM.from_config(  # type: ignore[no-untyped-call]
                self.config, dtype=torch.float32, attn_implementation=PREFILL_ATTENTION
            ).eval()
        if is_adapter_source(source_uri):  # a LoRA run: merged into its base, see weights.py
            self._lora_base = apply_adapter_source(
                self.model, source_uri, sha256=sha256, loaded_base=self._lora_base
            )
        else:
            load_weight_source(self.model, source_uri, sha256=sha256)
            self._lora_base = ""
        self.version = version

    def release_memory(self) -> None:
        """Free weights and caches (after a drain); paused generations must be gone by now."""
        self._unbatch()
        self._prefix.clear()
        self.model = None
        self._lora_base = ""

    def kv_tokens_used(self) -> int:
        in_batch = self._batch.length * len(self._batch.ids) if self._batch is not None else 0
        own = sum(s.num_cached for s in self.seqs.values() if s.kv is not None)
        return in_batch + own + sum(len(e.token_ids) for e in self._prefix.values())


def _token_seed(seq: Sequence) -> int:
    """A per-position seed: sampling is reproducible across pauses and engines."""
    assert seq.sampling.seed is not None
    return (seq.sampling.seed * 1_000_003 + len(seq.output_ids)) % (1 << 63)
