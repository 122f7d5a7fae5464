"""A scripted EngineService for proxy tests and the proxy benchmark (a fake at the engine boundary).

The tiny model's words are nonsense, so tests that drive a harness through tool calls need an
engine whose output is known. This one serves the real EngineService contract (GenerateTokens,
Pause, ExportKV, ImportKV, Resume, Cancel, stats) over gRPC, with the output chosen by a
`script(prompt_ids) -> output_ids` function and one token every `token_interval_s`. Its "KV
cache" is the token ids themselves, so a migrated generation continues its script exactly
where it paused. Never routed to outside tests and benchmarks.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.errors import Conflict, NotFound
from gyre.rpc import GrpcServer

Script = Callable[[Sequence[int]], list[int]]
FR = engine_pb2.FinishReason
KV_BYTES_PER_TOKEN = 64


@dataclass(slots=True)
class _Gen:
    request_id: str
    execution_id: str
    prompt_ids: list[int]
    script: list[int]
    sampling: engine_pb2.SamplingParams
    emitted: int = 0
    state: str = "running"  # running | paused | finished | cancelled
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedEngine(engine_pb2_grpc.EngineServiceServicer):
    def __init__(
        self, script: Script, *, engine_id: str, cell_id: str, token_interval_s: float = 0.0, chunk: int = 1
    ) -> None:
        self.script = script
        self.engine_id = engine_id
        self.cell_id = cell_id
        self.token_interval_s = token_interval_s
        self.chunk = chunk
        self.gens: dict[str, _Gen] = {}
        self.prompts: list[list[int]] = []

    def _tokens(self, gen: _Gen, start: int, end: int, finish: int = 0) -> engine_pb2.GeneratedTokens:
        ids = gen.script[start:end]
        return engine_pb2.GeneratedTokens(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            policy_versions=[0] * len(ids),
            finish_reason=finish,  # type: ignore[arg-type]
        )

    async def _follow(self, gen: _Gen) -> AsyncIterator[engine_pb2.GeneratedTokens]:
        limit = min(len(gen.script), gen.sampling.max_tokens or len(gen.script))
        while True:
            if gen.state == "paused":
                yield self._tokens(gen, gen.emitted, gen.emitted, FR.FINISH_REASON_PAUSED)
                return
            if gen.state == "cancelled":
                yield self._tokens(gen, gen.emitted, gen.emitted, FR.FINISH_REASON_CANCELLED)
                return
            if gen.emitted >= limit:
                gen.state = "finished"
                reason = FR.FINISH_REASON_STOP if limit == len(gen.script) else FR.FINISH_REASON_LENGTH
                yield self._tokens(gen, gen.emitted, gen.emitted, reason)
                return
            if self.token_interval_s:
                gen.wake.clear()
                try:
                    await asyncio.wait_for(gen.wake.wait(), timeout=self.token_interval_s)
                except TimeoutError:
                    pass
                if gen.state != "running":
                    continue
            start, gen.emitted = gen.emitted, min(gen.emitted + self.chunk, limit)
            yield self._tokens(gen, start, gen.emitted)

    async def GenerateTokens(
        self, request: engine_pb2.GenerateTokensRequest, context: Any
    ) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        prompt = list(request.prompt_ids)
        self.prompts.append(prompt)
        gen = _Gen(
            request_id=request.request_id,
            execution_id=request.execution_id,
            prompt_ids=prompt,
            script=self.script(prompt),
            sampling=request.sampling,
        )
        self.gens[request.request_id] = gen
        first = True
        async for tokens in self._follow(gen):
            yield engine_pb2.GenerateTokensResponse(
                tokens=tokens, num_prompt_tokens=len(prompt) if first else 0
            )
            first = False

    async def PauseGeneration(
        self, request: engine_pb2.PauseGenerationRequest, context: Any
    ) -> engine_pb2.PauseGenerationResponse:
        gen = self.gens.get(request.request_id)
        if gen is None or gen.state not in ("running", "paused"):
            raise NotFound(f"no running generation {request.request_id!r}")
        gen.state = "paused"
        gen.wake.set()
        size = (len(gen.prompt_ids) + gen.emitted) * KV_BYTES_PER_TOKEN
        kv = engine_pb2.KvHandle(
            engine_id=self.engine_id,
            request_id=gen.request_id,
            num_tokens=len(gen.prompt_ids) + gen.emitted,
            size_bytes=size,
        )
        return engine_pb2.PauseGenerationResponse(tokens=self._tokens(gen, 0, gen.emitted), kv=kv)

    async def ExportKV(
        self, request: engine_pb2.ExportKVRequest, context: Any
    ) -> AsyncIterator[engine_pb2.ExportKVResponse]:
        gen = self.gens.get(request.request_id)
        if gen is None or gen.state != "paused":
            raise Conflict(f"generation {request.request_id!r} is not paused here")
        blob = bytes(KV_BYTES_PER_TOKEN * (len(gen.prompt_ids) + gen.emitted))
        header = engine_pb2.KvHeader(
            request_id=gen.request_id,
            execution_id=gen.execution_id,
            token_ids=[*gen.prompt_ids, *gen.script[: gen.emitted]],
            num_prompt_tokens=len(gen.prompt_ids),
            output=self._tokens(gen, 0, gen.emitted),
            sampling=gen.sampling,
            size_bytes=len(blob),
            sha256=hashlib.sha256(blob).hexdigest(),
        )
        yield engine_pb2.ExportKVResponse(header=header)
        yield engine_pb2.ExportKVResponse(chunk=engine_pb2.KvChunk(offset_bytes=0, data=blob))

    async def ImportKV(
        self, request_iterator: AsyncIterator[engine_pb2.ImportKVRequest], context: Any
    ) -> engine_pb2.ImportKVResponse:
        header: engine_pb2.KvHeader | None = None
        received = 0
        async for part in request_iterator:
            if part.HasField("header"):
                header = part.header
            else:
                received += len(part.chunk.data)
        assert header is not None and received == header.size_bytes
        prompt = list(header.token_ids[: header.num_prompt_tokens])
        gen = _Gen(
            request_id=header.request_id,
            execution_id=header.execution_id,
            prompt_ids=prompt,
            script=self.script(prompt),
            sampling=header.sampling,
            emitted=len(header.output.token_ids),
            state="paused",
        )
        self.gens[gen.request_id] = gen
        return engine_pb2.ImportKVResponse(
            kv=engine_pb2.KvHandle(engine_id=self.engine_id, request_id=gen.request_id, size_bytes=received)
        )

    async def ResumeGeneration(
        self, request: engine_pb2.ResumeGenerationRequest, context: Any
    ) -> AsyncIterator[engine_pb2.ResumeGenerationResponse]:
        gen = self.gens.get(request.request_id)
        if gen is None or gen.state != "paused":
            raise Conflict(f"generation {request.request_id!r} is not paused here")
        gen.state = "running"
        async for tokens in self._follow(gen):
            yield engine_pb2.ResumeGenerationResponse(tokens=tokens)

    async def CancelGeneration(
        self, request: engine_pb2.CancelGenerationRequest, context: Any
    ) -> engine_pb2.CancelGenerationResponse:
        gen = self.gens.pop(request.request_id, None)
        if gen is not None:
            gen.state = "cancelled"
            gen.wake.set()
        return engine_pb2.CancelGenerationResponse()

    async def GetEngineStats(
        self, request: engine_pb2.GetEngineStatsRequest, context: Any
    ) -> engine_pb2.GetEngineStatsResponse:
        running = sum(1 for g in self.gens.values() if g.state == "running")
        return engine_pb2.GetEngineStatsResponse(
            engine_id=self.engine_id,
            cell_id=self.cell_id,
            state=engine_pb2.ENGINE_STATE_SERVING,
            num_running_generations=running,
        )


async def start_scripted_engine(
    script: Script, *, engine_id: str, cell_id: str, token_interval_s: float = 0.0
) -> tuple[GrpcServer, ScriptedEngine]:
    engine = ScriptedEngine(script, engine_id=engine_id, cell_id=cell_id, token_interval_s=token_interval_s)
    server = GrpcServer(
        service_names=[engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name],
        host="127.0.0.1",
        port=0,
    )
    engine_pb2_grpc.add_EngineServiceServicer_to_server(engine, server.server)
    await server.start()
    return server, engine


def continuing(reply: list[int]) -> Script:
    """A script that answers `reply`, or the rest of it when the prompt already ends with its
    beginning (a call resumed here after another engine died part-way through it)."""

    def script(prompt: Sequence[int]) -> list[int]:
        for done in range(min(len(prompt), len(reply) - 1), 0, -1):
            if list(prompt[-done:]) == reply[:done]:
                return reply[done:]
        return reply

    return script


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.scripted_engine --port N`: serve a fixed reply of `--tokens` ids (benchmarks)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m bench.scripted_engine")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=16, help="output ids per generation")
    parser.add_argument("--token-interval-s", type=float, default=0.0)
    parser.add_argument("--stop-id", type=int, required=True, help="the model's end-of-turn id, last")
    parser.add_argument("--engine-id", default="bench-engine")
    parser.add_argument("--cell-id", default="cell-1")
    parser.add_argument(
        "--continue", dest="resume", action="store_true", help="a resumed call gets the rest of the reply"
    )
    ns = parser.parse_args(argv)
    reply = [100 + i % 200 for i in range(ns.tokens - 1)] + [ns.stop_id]

    async def serve() -> None:
        engine = ScriptedEngine(
            continuing(reply) if ns.resume else (lambda prompt: reply),
            engine_id=ns.engine_id,
            cell_id=ns.cell_id,
            token_interval_s=ns.token_interval_s,
        )
        server = GrpcServer(
            service_names=[engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name],
            host="127.0.0.1",
            port=ns.port,
        )
        engine_pb2_grpc.add_EngineServiceServicer_to_server(engine, server.server)
        await server.start()
        await asyncio.Event().wait()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
