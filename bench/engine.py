"""Engine benchmark: decode throughput, KV move vs re-prefill at 8k, migration identity, weight swap.

`python -m bench.engine --json` prints one JSON object on its last line. It creates the tiny model
(`gyre model init` defaults: 4 layers, width 128, 4 query heads / 1 KV head, float32) in a
temporary folder, runs two engines in this process and talks to them over gRPC on loopback.

- decode_tokens_per_s_b{1,8,32}: output tokens per second of decode steps with B generations
  batched (prefill excluded), torch engine core, `--threads` CPU threads.
- kv_import_speedup_8k: time to prefill an 8192-token context from scratch on engine B, over
  the time to stream its KV from A to B (ExportKV -> ImportKV, checksum and checks included).
- migration_identical: a greedy generation paused on A, moved to B and resumed there equals the
  uninterrupted run, and B's prefill counter did not move.
- weight_update_s: UpdateWeights from a `model.safetensors` folder while a generation runs.
- prefill_tokens_per_s: prompt tokens per second prefilling one `--prefill-context`-token prompt
  (16,384 by default) in the engine's chunks, with its prefill attention (services/engine/
  attention.py), and `..._sdpa_mask` with transformers' SDPA path over an explicit causal mask
  (what the engine ran before); `prefill_speedup` is their ratio. The two run back to back.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import torch

from gyre.engine.v1 import engine_pb2 as pb
from gyre.engine.v1 import engine_pb2_grpc
from gyre.settings import KernelSettings
from services.engine.config import EngineSettings
from services.engine.main import build
from services.engine.model_init import init_model
from services.engine.sampling import Sampling
from services.engine.torch_engine import TorchEngine


def decode_throughput(model_dir: Path, batch: int, *, new_tokens: int = 48) -> float:
    engine = TorchEngine(model_dir, engine_id="bench", max_batch=batch)
    for i in range(batch):
        prompt = [(7 * i + j) % 500 + 10 for j in range(16)]
        engine.submit(
            request_id=f"d{i}", execution_id="", prompt_ids=prompt, sampling=Sampling(max_tokens=new_tokens)
        )
    engine.step()  # admission and prefill, then the first decode step
    engine.eos_ids = frozenset()  # keep every row running for the whole measurement
    produced, started = 0, time.perf_counter()
    while engine.has_work():
        produced += len(engine.step())
    return produced / (time.perf_counter() - started)


def prefill_throughput(model_dir: Path, tokens: int, *, attention: str | None = None) -> float:
    """Prompt tokens per second until the first output token (prefill plus one decode step)."""
    engine = TorchEngine(model_dir, engine_id="bench-prefill")
    if attention is not None:
        engine.model.set_attn_implementation(attention)
    prompt = [(13 * j) % 500 + 10 for j in range(tokens)]
    engine.submit(request_id="p", execution_id="", prompt_ids=prompt, sampling=Sampling(max_tokens=1))
    started = time.perf_counter()
    while not engine.step():
        pass
    return tokens / (time.perf_counter() - started)


async def read_all(call: Any) -> tuple[list[int], int]:
    ids: list[int] = []
    finish = 0
    while (m := await call.read()) is not grpc.aio.EOF:
        ids += m.tokens.token_ids
        finish = m.tokens.finish_reason
    return ids, finish


async def move_kv(src: Any, dst: Any, request_id: str) -> pb.ImportKVResponse:
    async def requests() -> Any:
        async for m in src.ExportKV(pb.ExportKVRequest(request_id=request_id, max_chunk_bytes=1 << 20)):
            if m.WhichOneof("part") == "header":
                yield pb.ImportKVRequest(header=m.header)
            else:
                yield pb.ImportKVRequest(chunk=m.chunk)

    response: pb.ImportKVResponse = await dst.ImportKV(requests())
    return response


async def grpc_figures(model_dir: Path, threads: int, context_tokens: int) -> dict[str, Any]:
    def settings(engine_id: str) -> EngineSettings:
        return EngineSettings(
            model_dir=model_dir, engine_id=engine_id, publish_events=False, num_threads=threads
        )

    a = await build(settings("a"), KernelSettings())
    b = await build(settings("b"), KernelSettings())
    await a.start()
    await b.start()
    out: dict[str, Any] = {}
    try:
        async with grpc.aio.insecure_channel(a.address) as ch_a, grpc.aio.insecure_channel(b.address) as ch_b:
            api_a, api_b = engine_pb2_grpc.EngineServiceStub(ch_a), engine_pb2_grpc.EngineServiceStub(ch_b)
            long_prompt = [(13 * j) % 500 + 10 for j in range(context_tokens)]

            # Re-prefill on B: what a migration without KV transfer costs.
            started = time.perf_counter()
            await read_all(
                api_b.GenerateTokens(
                    pb.GenerateTokensRequest(
                        request_id="prefill", prompt_ids=long_prompt, sampling=pb.SamplingParams(max_tokens=1)
                    )
                )
            )
            reprefill_s = time.perf_counter() - started

            call = api_a.GenerateTokens(
                pb.GenerateTokensRequest(
                    request_id="long", prompt_ids=long_prompt, sampling=pb.SamplingParams(max_tokens=64)
                )
            )
            await call.read()
            paused = await api_a.PauseGeneration(pb.PauseGenerationRequest(request_id="long"))
            await read_all(call)
            started = time.perf_counter()
            imported = await move_kv(api_a, api_b, "long")
            move_s = time.perf_counter() - started
            out["kv_context_tokens"] = imported.kv.num_tokens
            out["kv_bytes"] = paused.kv.size_bytes
            out["reprefill_s"] = round(reprefill_s, 4)
            out["kv_transfer_import_s"] = round(move_s, 4)
            out["kv_import_speedup_8k"] = round(reprefill_s / move_s, 2)

            # Migration identity on a short context.
            prompt = [1, 419, 205, 78, 79, 2, 205, 1, 298, 358, 205]
            whole, _ = await read_all(
                api_a.GenerateTokens(
                    pb.GenerateTokensRequest(
                        request_id="whole", prompt_ids=prompt, sampling=pb.SamplingParams(max_tokens=48)
                    )
                )
            )
            call = api_a.GenerateTokens(
                pb.GenerateTokensRequest(
                    request_id="mig", prompt_ids=prompt, sampling=pb.SamplingParams(max_tokens=48)
                )
            )
            await call.read()
            paused = await api_a.PauseGeneration(pb.PauseGenerationRequest(request_id="mig"))
            await read_all(call)
            before = (await api_b.GetEngineStats(pb.GetEngineStatsRequest())).num_prefill_tokens
            await move_kv(api_a, api_b, "mig")
            rest, _ = await read_all(api_b.ResumeGeneration(pb.ResumeGenerationRequest(request_id="mig")))
            after = (await api_b.GetEngineStats(pb.GetEngineStatsRequest())).num_prefill_tokens
            out["migration_identical"] = list(paused.tokens.token_ids) + rest == whole and after == before

            # Weight swap while a generation runs.
            call = api_a.GenerateTokens(
                pb.GenerateTokensRequest(
                    request_id="during-swap", prompt_ids=prompt, sampling=pb.SamplingParams(max_tokens=48)
                )
            )
            await call.read()
            started = time.perf_counter()
            update = await api_a.UpdateWeights(
                pb.UpdateWeightsRequest(
                    request_id="swap", version={"steps": 1}, source_uri=f"file://{model_dir}"
                )
            )
            out["weight_update_rpc_s"] = round(time.perf_counter() - started, 4)
            out["weight_update_s"] = round(update.duration_s, 4)
            await read_all(call)
    finally:
        await a.stop(0.5)
        await b.stop(0.5)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print only the JSON object")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--context", type=int, default=8192, help="context tokens moved (default 8192)")
    parser.add_argument(
        "--prefill-context", type=int, default=16384, help="prompt tokens to prefill (default 16384)"
    )
    ns = parser.parse_args(argv)
    torch.set_num_threads(ns.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = init_model(Path(tmp) / "model")
        figures: dict[str, Any] = {
            "model": "tiny qwen2: 4 layers, width 128, 4 q heads / 1 kv head, float32",
            "threads": ns.threads,
        }
        decode_throughput(model_dir, 2, new_tokens=8)  # warm-up: first-call costs of torch kernels
        for batch in (1, 8, 32):
            runs = sorted(decode_throughput(model_dir, batch) for _ in range(3))
            figures[f"decode_tokens_per_s_b{batch}"] = round(runs[1], 1)  # median of 3: the CPU is shared
        figures.update(asyncio.run(grpc_figures(model_dir, ns.threads, ns.context)))
        fast = prefill_throughput(model_dir, ns.prefill_context)
        masked = prefill_throughput(model_dir, ns.prefill_context, attention="sdpa")
        figures["prefill_context_tokens"] = ns.prefill_context
        figures["prefill_tokens_per_s"] = round(fast, 1)
        figures["prefill_tokens_per_s_sdpa_mask"] = round(masked, 1)
        figures["prefill_speedup"] = round(fast / masked, 2)
    if not ns.json:
        for key, value in figures.items():
            print(f"{key:>28}: {value}")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
