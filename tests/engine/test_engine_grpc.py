"""The engine over gRPC: migration between two engines, KV checks, prefix reuse, weights, drain."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import nats
import pytest
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM

from gyre.bus import stream_name
from gyre.common.v1 import envelope_pb2
from gyre.engine.v1 import engine_pb2 as pb
from gyre.engine.v1 import engine_pb2_grpc, events_pb2
from gyre.runtime import ServiceHost
from gyre.settings import KernelSettings
from tests.engine.conftest import engine_settings, start_engine

PROMPT = [1, 419, 205, 78, 79, 2, 205, 1, 298, 358, 205]


def stub(host: ServiceHost) -> tuple[grpc.aio.Channel, Any]:
    channel = grpc.aio.insecure_channel(host.address)
    return channel, engine_pb2_grpc.EngineServiceStub(channel)


def greedy(max_tokens: int) -> pb.SamplingParams:
    return pb.SamplingParams(max_tokens=max_tokens)


def reference_greedy(model_dir: Path, prompt: list[int], n: int) -> list[int]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None)
    return [int(t) for t in out[0, len(prompt) :]]


async def read_all(call: Any) -> tuple[list[int], list[int], int]:
    ids: list[int] = []
    versions: list[int] = []
    finish = 0
    while (m := await call.read()) is not grpc.aio.EOF:
        ids += m.tokens.token_ids
        versions += m.tokens.policy_versions
        finish = m.tokens.finish_reason
    return ids, versions, finish


async def export_all(api: Any, request_id: str) -> list[pb.ExportKVResponse]:
    return [m async for m in api.ExportKV(pb.ExportKVRequest(request_id=request_id, max_chunk_bytes=4096))]


async def as_import(messages: list[pb.ExportKVResponse]) -> AsyncIterator[pb.ImportKVRequest]:
    for m in messages:
        if m.WhichOneof("part") == "header":
            yield pb.ImportKVRequest(header=m.header)
        else:
            yield pb.ImportKVRequest(chunk=m.chunk)


async def test_paused_on_a_moved_to_b_resumes_token_for_token_without_prefill(
    engine_pair: tuple[ServiceHost, ServiceHost], model_dir: Path
) -> None:
    a, b = engine_pair
    ch_a, api_a = stub(a)
    ch_b, api_b = stub(b)
    async with ch_a, ch_b:
        call = api_a.GenerateTokens(
            pb.GenerateTokensRequest(
                request_id="mig-1", execution_id="e1", prompt_ids=PROMPT, sampling=greedy(30)
            )
        )
        first = await call.read()
        paused = await api_a.PauseGeneration(pb.PauseGenerationRequest(request_id="mig-1"))
        streamed, _, finish = await read_all(call)
        assert finish == pb.FINISH_REASON_PAUSED
        assert list(first.tokens.token_ids) + streamed == list(paused.tokens.token_ids)
        assert paused.kv.num_tokens == len(PROMPT) + len(paused.tokens.token_ids) - 1

        exported = await export_all(api_a, "mig-1")
        assert len(exported) > 2  # header + several chunks
        prefill_before = (await api_b.GetEngineStats(pb.GetEngineStatsRequest())).num_prefill_tokens
        imported = await api_b.ImportKV(as_import(exported))
        assert imported.kv.num_tokens == paused.kv.num_tokens and imported.kv.engine_id == "b"
        resumed, _, finish = await read_all(
            api_b.ResumeGeneration(pb.ResumeGenerationRequest(request_id="mig-1"))
        )
        stats_b = await api_b.GetEngineStats(pb.GetEngineStatsRequest())

    assert list(paused.tokens.token_ids) + resumed == reference_greedy(model_dir, PROMPT, 30)
    assert finish == pb.FINISH_REASON_LENGTH
    assert stats_b.num_prefill_tokens == prefill_before  # B computed nothing over the migrated prefix


async def test_truncated_or_foreign_kv_is_refused_and_the_engine_keeps_serving(
    engine_pair: tuple[ServiceHost, ServiceHost], other_model_dir: Path
) -> None:
    a, b = engine_pair
    other = await start_engine(engine_settings(other_model_dir, "other"))
    ch_a, api_a = stub(a)
    ch_b, api_b = stub(b)
    ch_o, api_o = stub(other)
    try:
        async with ch_a, ch_b, ch_o:
            for api, rid in ((api_a, "trunc-1"), (api_o, "foreign-1")):
                call = api.GenerateTokens(
                    pb.GenerateTokensRequest(request_id=rid, prompt_ids=PROMPT, sampling=greedy(20))
                )
                await call.read()
                await api.PauseGeneration(pb.PauseGenerationRequest(request_id=rid))
                await read_all(call)
            truncated = (await export_all(api_a, "trunc-1"))[:-1]
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await api_b.ImportKV(as_import(truncated))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "truncated" in (refused.value.details() or "")

            foreign = await export_all(api_o, "foreign-1")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await api_b.ImportKV(as_import(foreign))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "model" in (refused.value.details() or "")

            for call_unknown in (
                api_b.PauseGeneration(pb.PauseGenerationRequest(request_id="nope")),
                read_all(api_b.ResumeGeneration(pb.ResumeGenerationRequest(request_id="nope"))),
                export_all(api_b, "nope"),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await call_unknown
                assert missing.value.code() == grpc.StatusCode.NOT_FOUND

            ids, _, finish = await read_all(
                api_b.GenerateTokens(
                    pb.GenerateTokensRequest(request_id="still-ok", prompt_ids=PROMPT, sampling=greedy(4))
                )
            )
            assert len(ids) == 4 and finish == pb.FINISH_REASON_LENGTH
    finally:
        await other.stop(0.5)


async def test_a_later_call_of_the_same_execution_reuses_the_prefix(
    engine_pair: tuple[ServiceHost, ServiceHost], model_dir: Path
) -> None:
    a, _ = engine_pair
    ch, api = stub(a)
    async with ch:
        first, _, _ = await read_all(
            api.GenerateTokens(
                pb.GenerateTokensRequest(
                    request_id="pfx-1", execution_id="exec-p", prompt_ids=PROMPT, sampling=greedy(6)
                )
            )
        )
        follow_up = PROMPT + first + [1, 419, 205]
        call = api.GenerateTokens(
            pb.GenerateTokensRequest(
                request_id="pfx-2", execution_id="exec-p", prompt_ids=follow_up, sampling=greedy(6)
            )
        )
        head = await call.read()
        rest, _, _ = await read_all(call)
    assert head.num_prompt_tokens == len(follow_up)
    assert head.num_cached_prompt_tokens == len(PROMPT) + len(first) - 1
    assert list(head.tokens.token_ids) + rest == reference_greedy(model_dir, follow_up, 6)


async def test_weights_swap_mid_generation_without_dropping_it(
    model_dir: Path, tmp_path: Path, kernel: KernelSettings
) -> None:
    host = await start_engine(engine_settings(model_dir, "w", publish_events=True), kernel)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}
    (tmp_path / "v1").mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "v1" / "model.safetensors"))
    ch, api = stub(host)
    try:
        async with ch:
            call = api.GenerateTokens(
                pb.GenerateTokensRequest(request_id="wu-1", prompt_ids=PROMPT, sampling=greedy(40))
            )
            first = await call.read()
            update = await api.UpdateWeights(
                pb.UpdateWeightsRequest(
                    request_id="upd-1", version={"steps": 1}, source_uri=f"file://{tmp_path / 'v1'}"
                )
            )
            rest, versions, finish = await read_all(call)
            bad = api.UpdateWeights(
                pb.UpdateWeightsRequest(
                    request_id="upd-2", version={"steps": 2}, source_uri=str(tmp_path / "missing")
                )
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await bad
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            stats = await api.GetEngineStats(pb.GetEngineStatsRequest())
    finally:
        await host.stop(0.5)
    all_versions = list(first.tokens.policy_versions) + versions
    assert update.previous_version.steps == 0 and update.version.steps == 1
    # Not dropped: it ran to its length, or the new weights chose the end-of-turn token.
    assert (len(all_versions), finish) == (40, pb.FINISH_REASON_LENGTH) or (
        finish == pb.FINISH_REASON_STOP and rest[-1] == 2
    )
    assert all_versions[0] == 0 and all_versions[-1] == 1
    assert all_versions == sorted(all_versions)  # once swapped, every later token is the new version
    assert stats.policy_version.steps == 1

    nc = await nats.connect(kernel.nats_url)
    try:
        js = nc.jetstream()
        raw = await js.get_last_msg(
            stream_name("engine", prefix=kernel.bus_prefix),
            f"{kernel.bus_prefix}.engine.v1.EngineWeightsUpdated",
        )
    finally:
        await nc.close()
    event = events_pb2.EngineWeightsUpdated()
    envelope_pb2.Envelope.FromString(raw.data).payload.Unpack(event)
    assert event.engine_id == "w" and event.version.steps == 1 and event.request_id == "upd-1"


async def test_drain_pauses_in_flight_and_only_a_weight_update_returns_to_service(
    model_dir: Path, tmp_path: Path
) -> None:
    host = await start_engine(engine_settings(model_dir, "d"))
    ch, api = stub(host)
    try:
        async with ch:
            call = api.GenerateTokens(
                pb.GenerateTokensRequest(request_id="dr-1", prompt_ids=PROMPT, sampling=greedy(40))
            )
            await call.read()
            drained = await api.DrainEngine(
                pb.DrainEngineRequest(request_id="drain-1", pause_in_flight=True, release_memory=True)
            )
            assert list(drained.paused_request_ids) == ["dr-1"] and drained.state == pb.ENGINE_STATE_DRAINING
            assert (await read_all(call))[2] == pb.FINISH_REASON_PAUSED
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await read_all(
                    api.GenerateTokens(
                        pb.GenerateTokensRequest(request_id="dr-2", prompt_ids=PROMPT, sampling=greedy(4))
                    )
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            await api.CancelGeneration(pb.CancelGenerationRequest(request_id="dr-1"))
            stats = await api.GetEngineStats(pb.GetEngineStatsRequest())
            assert stats.state == pb.ENGINE_STATE_DRAINED
            await api.UpdateWeights(
                pb.UpdateWeightsRequest(request_id="back-1", version={"steps": 1}, source_uri=str(model_dir))
            )
            ids, _, _ = await read_all(
                api.GenerateTokens(
                    pb.GenerateTokensRequest(request_id="dr-3", prompt_ids=PROMPT, sampling=greedy(4))
                )
            )
            assert ids == reference_greedy(model_dir, PROMPT, 4)
    finally:
        await host.stop(0.5)


def test_gyre_model_init_writes_a_loadable_checkpoint_with_a_tool_call_template(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gyre_app.cli", "model", "init", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "list files"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
            ],
        },
        {"role": "tool", "content": "a.py"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call><|im_end|>' in text
    assert "<tool_response>\na.py\n</tool_response>" in text and text.endswith("<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.convert_tokens_to_ids("<tool_call>") != tok.unk_token_id
