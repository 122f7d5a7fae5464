"""The emulated engine (emulation only) through the real EngineService contract over gRPC: scripted
deterministic tokens, pause/export/import/resume across two engines, cancel, drain, weight
versions, stats, refusals; and the emulated path imports no torch."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre_app.emulation.cells import EmulatedCells
from gyre_app.emulation.profile import load_profile
from services.engine.emulated_script import reply_ids

REPO = Path(__file__).resolve().parents[1]
H100 = REPO / "bench" / "profiles" / "h100-emulated.yaml"
VOCAB, EOS = 512, 2
# 22 ms modelled steps at 2,000x: the tests wait on behaviour, never on the clock.
TIME_SCALE = 2000.0


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cells() -> AsyncIterator[dict[str, Any]]:
    host = EmulatedCells(load_profile(H100))
    await host.start(
        ["cell-1", "cell-2"], vocab_size=VOCAB, eos_id=EOS, time_scale=TIME_SCALE, reply_tokens=24
    )
    # Real time for what must be caught mid-reply (22 ms a token): a move, a drain.
    slow = EmulatedCells(load_profile(H100))
    await slow.start(["cell-3", "cell-4"], vocab_size=VOCAB, eos_id=EOS, time_scale=1.0, reply_tokens=2000)
    addresses = {**host.addresses, **slow.addresses}
    channels = {c: grpc.aio.insecure_channel(a) for c, a in addresses.items()}
    stubs = {c: engine_pb2_grpc.EngineServiceStub(ch) for c, ch in channels.items()}
    yield {"host": host, "slow": slow, **stubs}
    for ch in channels.values():
        await ch.close()
    await host.close()
    await slow.close()


def request(rid: str, prompt: list[int], max_tokens: int = 100) -> engine_pb2.GenerateTokensRequest:
    return engine_pb2.GenerateTokensRequest(
        request_id=rid,
        execution_id=f"exec-{rid}",
        prompt_ids=prompt,
        sampling=engine_pb2.SamplingParams(max_tokens=max_tokens),
    )


async def collect(stream: Any) -> tuple[list[int], list[int], int]:
    ids: list[int] = []
    versions: list[int] = []
    finish = 0
    async for message in stream:
        ids += message.tokens.token_ids
        versions += message.tokens.policy_versions
        finish = message.tokens.finish_reason or finish
    return ids, versions, finish


async def test_a_generation_streams_the_scripted_reply_ending_with_end_of_turn(cells: dict[str, Any]) -> None:
    prompt = [1, 40, 41, 42]
    ids, versions, finish = await collect(cells["cell-1"].GenerateTokens(request("g1", prompt)))
    assert ids == reply_ids(prompt, length=24, vocab_size=VOCAB, eos_id=EOS)
    assert ids[-1] == EOS and finish == engine_pb2.FINISH_REASON_STOP
    assert versions == [0] * 24


async def test_max_tokens_cuts_the_reply_with_finish_length(cells: dict[str, Any]) -> None:
    ids, _, finish = await collect(cells["cell-1"].GenerateTokens(request("g2", [1, 5, 6], max_tokens=5)))
    assert len(ids) == 5 and finish == engine_pb2.FINISH_REASON_LENGTH


async def test_a_generation_moved_mid_reply_continues_token_for_token(cells: dict[str, Any]) -> None:
    a, b = cells["cell-3"], cells["cell-4"]
    prompt = [1, 60, 61, 62, 63]
    whole = reply_ids(prompt, length=2000, vocab_size=VOCAB, eos_id=EOS)[:40]
    stream = a.GenerateTokens(request("m1", prompt, max_tokens=40))
    first: list[int] = []
    async for message in stream:
        first += message.tokens.token_ids
        if first:
            break
    paused = await a.PauseGeneration(engine_pb2.PauseGenerationRequest(request_id="m1"))
    header: engine_pb2.KvHeader | None = None
    chunks: list[engine_pb2.KvChunk] = []
    async for part in a.ExportKV(engine_pb2.ExportKVRequest(request_id="m1")):
        if part.HasField("header"):
            header = part.header
        else:
            chunks.append(part.chunk)
    assert header is not None and header.num_cached_tokens == paused.kv.num_tokens

    async def parts() -> AsyncIterator[engine_pb2.ImportKVRequest]:
        yield engine_pb2.ImportKVRequest(header=header)
        for c in chunks:
            yield engine_pb2.ImportKVRequest(chunk=c)

    await b.ImportKV(parts())
    await a.CancelGeneration(engine_pb2.CancelGenerationRequest(request_id="m1"))
    rest, _, finish = await collect(b.ResumeGeneration(engine_pb2.ResumeGenerationRequest(request_id="m1")))
    assert list(paused.tokens.token_ids) + rest == whole
    assert finish == engine_pb2.FINISH_REASON_LENGTH


async def test_a_cache_from_another_model_is_refused_naming_the_field(cells: dict[str, Any]) -> None:
    data = b"\x01\x00\x00\x00"
    header = engine_pb2.KvHeader(
        request_id="x1",
        execution_id="e",
        token_ids=[1],
        num_prompt_tokens=1,
        num_cached_tokens=1,
        layout=engine_pb2.KvLayout(model_id="emulated:other:model"),
        size_bytes=4,
        sha256=hashlib.sha256(data).hexdigest(),
        sampling=engine_pb2.SamplingParams(max_tokens=4),
    )

    async def parts() -> AsyncIterator[engine_pb2.ImportKVRequest]:
        yield engine_pb2.ImportKVRequest(header=header)
        yield engine_pb2.ImportKVRequest(chunk=engine_pb2.KvChunk(offset_bytes=0, data=data))

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await cells["cell-2"].ImportKV(parts())
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "header.layout.model_id" in (err.value.details() or "")


async def test_a_prompt_outside_the_vocabulary_is_refused_and_the_engine_keeps_serving(
    cells: dict[str, Any],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(cells["cell-1"].GenerateTokens(request("bad", [1, VOCAB + 3])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_ids[1]" in (err.value.details() or "")
    ids, _, _ = await collect(cells["cell-1"].GenerateTokens(request("good", [1, 3])))
    assert ids[-1] == EOS


async def test_tokens_after_a_weight_update_carry_the_new_version(cells: dict[str, Any]) -> None:
    a = cells["cell-2"]
    update = engine_pb2.UpdateWeightsRequest(request_id="w1", source_uri="emulated://weights/v3")
    update.version.steps = 3
    answer = await a.UpdateWeights(update)
    assert (answer.previous_version.steps, answer.version.steps) == (0, 3)
    _, versions, _ = await collect(a.GenerateTokens(request("after-w", [1, 9, 9])))
    assert set(versions) == {3}
    stats = await a.GetEngineStats(engine_pb2.GetEngineStatsRequest())
    assert stats.policy_version.steps == 3 and stats.model_fingerprint.startswith("emulated:h100-emulated")
    old = engine_pb2.UpdateWeightsRequest(request_id="w0", source_uri="emulated://weights/v1")
    old.version.steps = 1
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await a.UpdateWeights(old)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_a_drain_pauses_what_runs_and_refuses_new_generations(cells: dict[str, Any]) -> None:
    host: EmulatedCells = cells["slow"]
    a = cells["cell-3"]
    stream = a.GenerateTokens(request("d1", [1, 70, 71], max_tokens=10_000))
    async for _ in stream:
        break
    drained = await a.DrainEngine(engine_pb2.DrainEngineRequest(request_id="drain-1", pause_in_flight=True))
    assert "d1" in drained.paused_request_ids
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(a.GenerateTokens(request("d2", [1, 2])))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    await a.CancelGeneration(engine_pb2.CancelGenerationRequest(request_id="d1"))
    assert host.engines["cell-3"].state.value == "drained"
    update = engine_pb2.UpdateWeightsRequest(request_id="back", source_uri="emulated://weights/v4")
    update.version.steps = 4
    await a.UpdateWeights(update)  # a cell back from training serves again
    ids, _, _ = await collect(a.GenerateTokens(request("d3", [1, 2], max_tokens=3)))
    assert len(ids) == 3


def test_the_emulated_path_imports_no_torch() -> None:
    code = (
        "import sys, gyre_app.emulation.cells, services.engine.emulated_engine;"
        "sys.exit(1 if 'torch' in sys.modules or 'transformers' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
