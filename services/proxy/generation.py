"""One call's generation on the engines, following it across migrations (shell: grpc.aio).

A `Generation` streams tokens from the engine it was routed to. When a drain pauses it there,
the engine's stream ends with FINISH_REASON_PAUSED; the generation then waits for the drain to
hand it a destination (`move_to`) and continues there with ResumeGeneration (KV imported) or,
when the KV could not travel, with a fresh GenerateTokens over prompt + output so far. An
engine that dies mid-generation (its stream breaks: UNAVAILABLE, or it ends with no finish
reason) is not planned for: the generation asks `on_broken` for another engine and continues
there the same way, prompt + output so far recomputed (at most `max_resumes` times). An engine
that hangs with its stream open (no message for `stall_s`) is treated the same way: its stream
is cancelled and the call fails over. Tokens are counted by position, so the harness's stream
sees each token exactly once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import structlog

from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.errors import Unavailable
from gyre.rpc import MAX_MESSAGE_BYTES
from gyre.rpc_telemetry import channel as traced_channel
from services.proxy.routing import Route

log = structlog.get_logger(__name__)
FR = engine_pb2.FinishReason
BROKEN = (grpc.StatusCode.UNAVAILABLE,)
"""Stream errors that mean the engine (or the link to it) is gone, not that the call is wrong."""


class EngineStalled(Exception):
    """An engine's stream stayed open without a message for the stall timeout."""


class EnginePool:
    """One channel per engine address, reused by every call."""

    def __init__(self) -> None:
        # Typed Any: grpc's generated stubs describe the sync API, these are grpc.aio calls.
        self._stubs: dict[str, Any] = {}
        self._channels: list[grpc.aio.Channel] = []

    def stub(self, address: str) -> Any:
        stub = self._stubs.get(address)
        if stub is None:
            channel = traced_channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ],
            )
            self._channels.append(channel)
            stub = self._stubs[address] = engine_pb2_grpc.EngineServiceStub(channel)
        return stub

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close(None)
        self._channels.clear()
        self._stubs.clear()


@dataclass(frozen=True, slots=True, kw_only=True)
class Move:
    """Where a paused generation continues; `resume` False means its KV did not travel."""

    route: Route
    resume: bool
    output: engine_pb2.GeneratedTokens


@dataclass(slots=True)
class Generation:
    call_id: str
    execution_id: str
    prompt_ids: tuple[int, ...]
    sampling: engine_pb2.SamplingParams
    route: Route
    pool: EnginePool
    pause_wait_s: float = 60.0
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    num_cached_prompt_tokens: int = 0
    num_migrations: int = 0
    finish: int = FR.FINISH_REASON_UNSPECIFIED
    done: bool = False
    migrating: bool = False
    on_move: Callable[[str, str], None] | None = None
    on_version: Callable[[str, int], None] | None = None
    on_broken: Callable[[Route], Awaitable[Route | None]] | None = None
    """Another engine for this call when its engine's stream broke (None: no other serves)."""
    on_behind: Callable[[str], None] | None = None
    """An engine refused the call as needing newer weights than it holds (its version is stale)."""
    min_version: int = 0
    """Oldest policy version whose weights may generate this call (its execution's admitted one)."""
    max_resumes: int = 3
    stall_s: float = 0.0
    """An engine stream silent this long (no token, no finish) counts as broken; 0: never."""
    num_resumes: int = 0
    cancelled: bool = False
    _moves: asyncio.Queue[Move] = field(default_factory=asyncio.Queue)

    def move_to(self, move: Move) -> None:
        """Called by a drain once the generation is paused and (maybe) its KV imported elsewhere."""
        self._moves.put_nowait(move)

    def _take(self, tokens: engine_pb2.GeneratedTokens, *, start: int) -> list[int]:
        """Append the tokens of `tokens` (which begin at output position `start`) not seen yet."""
        skip = len(self.output_ids) - start
        ids = list(tokens.token_ids)[max(skip, 0) :]
        if skip < 0:
            raise Unavailable(f"engine stream of call {self.call_id} skipped {-skip} token(s)")
        self.output_ids.extend(ids)
        self.logprobs.extend(list(tokens.logprobs)[max(skip, 0) :])
        versions = list(tokens.policy_versions)[max(skip, 0) :]
        self.versions.extend(versions or [self.route.policy_version] * len(ids))
        if versions and self.on_version is not None:
            self.on_version(self.route.engine_id, versions[-1])
        return ids

    async def tokens(self) -> AsyncIterator[list[int]]:
        """New output ids as they are sampled, across engines, until the output ends."""
        stream = self._open_generate(self.prompt_ids, self.sampling)
        position = 0
        try:
            while True:
                broken = ""
                try:
                    async for message in self._watched(stream):
                        tokens = message.tokens
                        cached = getattr(message, "num_cached_prompt_tokens", 0)  # GenerateTokens only
                        if cached:
                            self.num_cached_prompt_tokens = cached
                        new = self._take(tokens, start=position)
                        position += len(tokens.token_ids)
                        if new:
                            yield new
                        if tokens.finish_reason != FR.FINISH_REASON_UNSPECIFIED:
                            self.finish = tokens.finish_reason
                            break
                except grpc.aio.AioRpcError as exc:
                    if exc.code() not in BROKEN or self.cancelled:
                        raise
                    broken = f"{exc.code().name} {exc.details()}"
                except EngineStalled as exc:
                    broken = str(exc)
                if not broken and self.finish == FR.FINISH_REASON_UNSPECIFIED and not self.cancelled:
                    broken = "the stream ended mid-call"
                if broken:
                    stream = await self._resume_elsewhere(broken)
                    position = len(self.output_ids)
                    continue
                if self.finish != FR.FINISH_REASON_PAUSED:
                    if self.finish == FR.FINISH_REASON_UNSPECIFIED:
                        raise Unavailable(
                            f"engine {self.route.engine_id} ended call {self.call_id} mid-stream"
                        )
                    return
                move = await self._wait_for_move()
                new = self._take(move.output, start=0)
                if new:
                    yield new
                self.finish = FR.FINISH_REASON_UNSPECIFIED
                position = len(self.output_ids)
                self._go_to(move.route)
                self.migrating = False
                if move.resume:
                    stream = self.pool.stub(self.route.address).ResumeGeneration(
                        engine_pb2.ResumeGenerationRequest(request_id=self.call_id)
                    )
                else:  # recompute: the destination prefills prompt + output so far
                    stream = self._recompute()
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.FAILED_PRECONDITION and self.on_behind is not None:
                self.on_behind(self.route.engine_id)  # e.g. too old for min_version: ask it again
            raise Unavailable(
                f"engine {self.route.engine_id} failed call {self.call_id}: {exc.code().name} {exc.details()}"
            ) from exc
        finally:
            self.done = True

    async def _watched(
        self, stream: AsyncIterator[engine_pb2.GenerateTokensResponse]
    ) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        """The stream's messages; EngineStalled (the RPC cancelled) when none comes for `stall_s`."""
        messages = aiter(stream)
        while True:
            try:
                async with asyncio.timeout(self.stall_s if self.stall_s > 0 else None):
                    message = await anext(messages)
            except StopAsyncIteration:
                return
            except TimeoutError:
                cancel = getattr(stream, "cancel", None)  # a grpc.aio call: tell the engine too
                if cancel is not None:
                    cancel()
                raise EngineStalled(f"no token from the engine for {self.stall_s:g} s") from None
            yield message

    def _go_to(self, route: Route) -> None:
        if route.engine_id != self.route.engine_id:
            self.num_migrations += 1
            if self.on_move is not None:
                self.on_move(self.route.engine_id, route.engine_id)
        self.route = route

    def _recompute(self) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        """Generate on over prompt + output so far (the engine prefills it), for the tokens left."""
        remaining = engine_pb2.SamplingParams()
        remaining.CopyFrom(self.sampling)
        remaining.max_tokens = max(self.sampling.max_tokens - len(self.output_ids), 1)
        return self._open_generate((*self.prompt_ids, *self.output_ids), remaining)

    async def _resume_elsewhere(self, broken: str) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        """The engine's stream broke: continue on another engine from the tokens so far."""
        target = await self.on_broken(self.route) if self.on_broken is not None else None
        if target is None or self.num_resumes >= self.max_resumes:
            raise Unavailable(f"engine {self.route.engine_id} failed call {self.call_id}: {broken}")
        self.num_resumes += 1
        log.warning(
            "call_resumed_after_engine_failure",
            call_id=self.call_id,
            failed_engine=self.route.engine_id,
            engine_id=target.engine_id,
            num_output_tokens=len(self.output_ids),
            error=broken,
        )
        self._go_to(target)
        return self._recompute()

    def _open_generate(
        self, prompt_ids: tuple[int, ...], sampling: engine_pb2.SamplingParams
    ) -> AsyncIterator[engine_pb2.GenerateTokensResponse]:
        request = engine_pb2.GenerateTokensRequest(
            request_id=self.call_id, execution_id=self.execution_id, prompt_ids=prompt_ids, sampling=sampling
        )
        if self.min_version:
            request.min_policy_version.steps = self.min_version
        stream: AsyncIterator[engine_pb2.GenerateTokensResponse] = self.pool.stub(
            self.route.address
        ).GenerateTokens(request)
        return stream

    async def _wait_for_move(self) -> Move:
        """A drain moves the paused call; if none does (the engine paused it itself), resume here."""
        try:
            return await asyncio.wait_for(self._moves.get(), timeout=self.pause_wait_s)
        except TimeoutError:
            log.warning("paused_call_not_moved", call_id=self.call_id, engine_id=self.route.engine_id)
            return Move(route=self.route, resume=True, output=engine_pb2.GeneratedTokens())

    async def cancel(self) -> None:
        """Free the engine's KV when the harness went away or the token was revoked."""
        self.cancelled = True
        try:
            await self.pool.stub(self.route.address).CancelGeneration(
                engine_pb2.CancelGenerationRequest(request_id=self.call_id), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            log.info("cancel_generation_failed", call_id=self.call_id, error=exc.code().name)
