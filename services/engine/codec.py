"""Conversions between the engine's protos and its domain types (pure)."""

from __future__ import annotations

from gyre.common.v1 import ids_pb2
from gyre.engine.v1 import engine_pb2
from gyre.errors import InvalidArgument
from gyre.ids import validate_request_id
from services.engine.kv_layout import ExportedKv, KvLayout
from services.engine.port import EngineState, EngineStats, PausedGeneration
from services.engine.sampling_params import Sampling
from services.engine.sequence import Emission, Finish

FINISH_TO_PROTO: dict[Finish, engine_pb2.FinishReason.ValueType] = {
    Finish.STOP: engine_pb2.FINISH_REASON_STOP,
    Finish.LENGTH: engine_pb2.FINISH_REASON_LENGTH,
    Finish.CONTEXT_LENGTH: engine_pb2.FINISH_REASON_CONTEXT_LENGTH,
    Finish.PAUSED: engine_pb2.FINISH_REASON_PAUSED,
    Finish.CANCELLED: engine_pb2.FINISH_REASON_CANCELLED,
}
STATE_TO_PROTO: dict[EngineState, engine_pb2.EngineState.ValueType] = {
    EngineState.STARTING: engine_pb2.ENGINE_STATE_STARTING,
    EngineState.SERVING: engine_pb2.ENGINE_STATE_SERVING,
    EngineState.DRAINING: engine_pb2.ENGINE_STATE_DRAINING,
    EngineState.DRAINED: engine_pb2.ENGINE_STATE_DRAINED,
    EngineState.UPDATING_WEIGHTS: engine_pb2.ENGINE_STATE_UPDATING_WEIGHTS,
}


def sampling_from_proto(p: engine_pb2.SamplingParams) -> Sampling:
    """Proto3 zeros mean 'unset' for top_p (-> 1.0); max_tokens 0 stays 0 and is refused."""
    return Sampling(
        temperature=p.temperature,
        top_p=p.top_p if p.top_p != 0.0 else 1.0,
        max_tokens=p.max_tokens,
        stop_ids=frozenset(p.stop_ids),
        seed=p.seed if p.HasField("seed") else None,
    )


def sampling_to_proto(s: Sampling) -> engine_pb2.SamplingParams:
    p = engine_pb2.SamplingParams(
        temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, stop_ids=sorted(s.stop_ids)
    )
    if s.seed is not None:
        p.seed = s.seed
    return p


def tokens_to_proto(e: Emission) -> engine_pb2.GeneratedTokens:
    return engine_pb2.GeneratedTokens(
        token_ids=e.token_ids,
        logprobs=e.logprobs,
        policy_versions=e.policy_versions,
        finish_reason=FINISH_TO_PROTO[e.finish]
        if e.finish is not None
        else engine_pb2.FINISH_REASON_UNSPECIFIED,
    )


def layout_to_proto(layout: KvLayout) -> engine_pb2.KvLayout:
    return engine_pb2.KvLayout(
        model_id=layout.model_id,
        dtype=layout.dtype,
        num_layers=layout.num_layers,
        num_kv_heads=layout.num_kv_heads,
        head_dim=layout.head_dim,
        block_size_tokens=layout.block_size_tokens,
    )


def layout_from_proto(p: engine_pb2.KvLayout) -> KvLayout:
    return KvLayout(
        model_id=p.model_id,
        dtype=p.dtype,
        num_layers=p.num_layers,
        num_kv_heads=p.num_kv_heads,
        head_dim=p.head_dim,
        block_size_tokens=p.block_size_tokens,
    )


def handle_to_proto(engine_id: str, paused: PausedGeneration) -> engine_pb2.KvHandle:
    handle = engine_pb2.KvHandle(
        engine_id=engine_id,
        request_id=paused.request_id,
        num_tokens=paused.num_cached_tokens,
        size_bytes=paused.kv_size_bytes,
        layout=layout_to_proto(paused.layout),
    )
    handle.expires_at.FromNanoseconds(int(paused.expires_at_s * 1e9))
    return handle


def header_to_proto(h: ExportedKv) -> engine_pb2.KvHeader:
    n = h.num_prompt_tokens
    return engine_pb2.KvHeader(
        request_id=h.request_id,
        execution_id=h.execution_id,
        token_ids=h.token_ids,
        num_prompt_tokens=n,
        output=engine_pb2.GeneratedTokens(
            token_ids=h.token_ids[n:], logprobs=h.output_logprobs, policy_versions=h.output_versions
        ),
        sampling=sampling_to_proto(h.sampling),
        layout=layout_to_proto(h.layout),
        size_bytes=h.size_bytes,
        sha256=h.sha256,
        num_cached_tokens=h.num_cached_tokens,
    )


def header_from_proto(p: engine_pb2.KvHeader) -> ExportedKv:
    validate_request_id(p.request_id, "header.request_id")
    output_ids = list(p.token_ids)[p.num_prompt_tokens :]
    if list(p.output.token_ids) != output_ids:
        raise InvalidArgument("header.output.token_ids", "must equal token_ids after the prompt")
    return ExportedKv(
        request_id=p.request_id,
        execution_id=p.execution_id,
        token_ids=tuple(p.token_ids),
        num_prompt_tokens=p.num_prompt_tokens,
        num_cached_tokens=p.num_cached_tokens,
        output_logprobs=tuple(p.output.logprobs),
        output_versions=tuple(p.output.policy_versions),
        sampling=sampling_from_proto(p.sampling),
        layout=layout_from_proto(p.layout),
        size_bytes=p.size_bytes,
        sha256=p.sha256,
    )


def stats_to_proto(s: EngineStats) -> engine_pb2.GetEngineStatsResponse:
    out = engine_pb2.GetEngineStatsResponse(
        engine_id=s.engine_id,
        cell_id=s.cell_id,
        state=STATE_TO_PROTO[s.state],
        policy_version=ids_pb2.PolicyVersion(steps=s.policy_version),
        num_running_generations=s.num_running,
        num_waiting_generations=s.num_waiting,
        num_paused_generations=s.num_paused,
        num_kv_cache_tokens_used=s.num_kv_tokens_used,
        num_kv_cache_tokens_total=s.num_kv_tokens_total,
        output_tokens_per_s=s.output_tokens_per_s,
        num_prefill_tokens=s.num_prefill_tokens,
        num_prefix_cache_hit_tokens=s.num_prefix_cache_hit_tokens,
        num_output_tokens=s.num_output_tokens,
        model_fingerprint=s.model_fingerprint,
    )
    out.observed_at.GetCurrentTime()
    return out
