"""EngineService gRPC methods over any engine adapter (shell: decode -> port -> encode)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import structlog

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.errors import Conflict, InvalidArgument
from gyre.ids import validate_request_id
from gyre.rpc import Context
from services.engine import codec
from services.engine.kv_layout import ExportedKv
from services.engine.port import EngineBackend

log = structlog.get_logger(__name__)
DEFAULT_CHUNK_BYTES = 1 << 20
# Below gRPC's default 4 MiB receive limit with room for framing, so any default client can read it.
MAX_CHUNK_BYTES = (4 << 20) - (64 << 10)


class EngineServicer(engine_pb2_grpc.EngineServiceServicer):
    def __init__(self, backend: EngineBackend) -> None:
        self.backend = backend

    async def GenerateTokens(
        self, request: engine_pb2.GenerateTokensRequest, context: Context
    ) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        validate_request_id(request.request_id)
        loaded = self.backend.stats().policy_version
        if request.min_policy_version.steps > loaded:
            # Weights only move forward, so an engine that holds the version now samples every
            # token of the generation with it or a newer one.
            raise Conflict(
                f"min_policy_version: the call needs weights of version {request.min_policy_version.steps} "
                f"or newer; this engine holds version {loaded}"
            )
        stream = await self.backend.generate(
            request_id=request.request_id,
            execution_id=request.execution_id,
            prompt_ids=list(request.prompt_ids),
            sampling=codec.sampling_from_proto(request.sampling),
        )
        first = True
        async for piece in stream:
            message = engine_pb2.GenerateTokensResponse(tokens=codec.tokens_to_proto(piece))
            if first:
                message.num_prompt_tokens = stream.num_prompt_tokens
                message.num_cached_prompt_tokens = stream.num_cached_prompt_tokens
                first = False
            yield message

    async def PauseGeneration(
        self, request: engine_pb2.PauseGenerationRequest, context: Context
    ) -> engine_pb2.PauseGenerationResponse:
        validate_request_id(request.request_id)
        paused = await self.backend.pause(request.request_id)
        return engine_pb2.PauseGenerationResponse(
            tokens=codec.tokens_to_proto(paused.output),
            kv=codec.handle_to_proto(self.backend.engine_id, paused),
        )

    async def ExportKV(
        self, request: engine_pb2.ExportKVRequest, context: Context
    ) -> AsyncIterator[engine_pb2.ExportKVResponse]:
        validate_request_id(request.request_id)
        chunk = min(request.max_chunk_bytes or DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES)
        header, data = await self.backend.export_kv(request.request_id)
        yield engine_pb2.ExportKVResponse(header=codec.header_to_proto(header))
        for offset in range(0, len(data), chunk):
            yield engine_pb2.ExportKVResponse(
                chunk=engine_pb2.KvChunk(offset_bytes=offset, data=data[offset : offset + chunk])
            )

    async def ImportKV(
        self, request_iterator: AsyncIterator[engine_pb2.ImportKVRequest], context: Context
    ) -> engine_pb2.ImportKVResponse:
        header: ExportedKv | None = None
        parts: list[bytes] = []
        received = 0
        async for message in request_iterator:
            if header is None:
                if message.WhichOneof("part") != "header":
                    raise InvalidArgument("header", "the first message of an import must be the header")
                header = codec.header_from_proto(message.header)
                continue
            if message.WhichOneof("part") != "chunk":
                raise InvalidArgument("header", "only the first message may be a header")
            if message.chunk.offset_bytes != received:
                raise InvalidArgument(
                    "chunk.offset_bytes",
                    f"expected {received}, got {message.chunk.offset_bytes}: a chunk is missing",
                )
            received += len(message.chunk.data)
            if received > header.size_bytes:
                raise InvalidArgument(
                    "chunks", f"stream carries more than the declared {header.size_bytes} bytes"
                )
            parts.append(message.chunk.data)
        if header is None:
            raise InvalidArgument("header", "the import stream was empty")
        paused = await self.backend.import_kv(header, b"".join(parts))
        log.info("kv_imported", request_id=header.request_id, num_tokens=paused.num_cached_tokens)
        return engine_pb2.ImportKVResponse(kv=codec.handle_to_proto(self.backend.engine_id, paused))

    async def ResumeGeneration(
        self, request: engine_pb2.ResumeGenerationRequest, context: Context
    ) -> AsyncIterator[engine_pb2.ResumeGenerationResponse]:
        validate_request_id(request.request_id)
        stream = await self.backend.resume(request.request_id)
        async for piece in stream:
            yield engine_pb2.ResumeGenerationResponse(tokens=codec.tokens_to_proto(piece))

    async def CancelGeneration(
        self, request: engine_pb2.CancelGenerationRequest, context: Context
    ) -> engine_pb2.CancelGenerationResponse:
        validate_request_id(request.request_id)
        return engine_pb2.CancelGenerationResponse(freed_bytes=await self.backend.cancel(request.request_id))

    async def DrainEngine(
        self, request: engine_pb2.DrainEngineRequest, context: Context
    ) -> engine_pb2.DrainEngineResponse:
        validate_request_id(request.request_id)
        result = await self.backend.drain(
            request_id=request.request_id,
            pause_in_flight=request.pause_in_flight,
            release_memory=request.release_memory,
        )
        return engine_pb2.DrainEngineResponse(
            paused_request_ids=result.paused_request_ids,
            num_running_generations=result.num_running,
            state=codec.STATE_TO_PROTO[result.state],
        )

    async def GetEngineStats(
        self, request: engine_pb2.GetEngineStatsRequest, context: Context
    ) -> engine_pb2.GetEngineStatsResponse:
        return codec.stats_to_proto(self.backend.stats())

    async def UpdateWeights(
        self, request: engine_pb2.UpdateWeightsRequest, context: Context
    ) -> engine_pb2.UpdateWeightsResponse:
        validate_request_id(request.request_id)
        if not request.HasField("version"):
            raise InvalidArgument("version", "is required")
        if not request.source_uri:
            raise InvalidArgument("source_uri", "is required: file:// path of the published weights")
        update = await self.backend.update_weights(
            request_id=request.request_id,
            version=request.version.steps,
            source_uri=request.source_uri,
            sha256=request.sha256,
        )
        response = engine_pb2.UpdateWeightsResponse(
            duration_s=update.duration_s, num_generations_continued=update.num_generations_continued
        )
        response.previous_version.steps = update.previous_version
        response.version.steps = update.version
        return response
