"""Move a draining cell's in-flight calls to other engines, with their KV cache (shell: grpc.aio).

Per call: PauseGeneration on the source (the call's stream there ends PAUSED), ExportKV from the
source piped into ImportKV on the destination, CancelGeneration on the source to free its
copy, then the call resumes on the destination (`Generation.move_to`). When the KV cannot
travel (export or import failed) the call still moves, and the destination recomputes its
prefix from prompt + output so far.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Collection
from dataclasses import dataclass

import grpc
import structlog

from gyre.engine.v1 import engine_pb2
from services.proxy.calls import CallRun, Calls
from services.proxy.generation import Move
from services.proxy.routing import Route

log = structlog.get_logger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class DrainResult:
    drained: bool
    num_migrated: int
    num_recomputed: int
    num_remaining: int
    kv_bytes: int
    duration_s: float


async def drain_cell(
    calls: Calls, *, cell_id: str, target_cells: Collection[str], timeout_s: float
) -> DrainResult:
    """Stop routing to `cell_id` and move its calls; the caller persists the route states."""
    started = time.monotonic()
    deadline = started + timeout_s
    router = calls.router
    router.set_cell_state(cell_id, "draining")
    migrated = recomputed = kv_bytes = 0
    while time.monotonic() < deadline:
        runs = _movable(calls, cell_id)
        if not runs:
            break
        results = await asyncio.gather(
            *(
                _move(calls, run, cell_id=cell_id, target_cells=target_cells, deadline=deadline)
                for run in runs
            )
        )
        for outcome, size in results:
            migrated += outcome == "migrated"
            recomputed += outcome == "recomputed"
            kv_bytes += size
        if all(outcome == "stuck" for outcome, _ in results):
            await asyncio.sleep(0.05)
    remaining = len(_movable(calls, cell_id))
    if remaining == 0:
        router.set_cell_state(cell_id, "drained")
    return DrainResult(
        drained=remaining == 0,
        num_migrated=migrated,
        num_recomputed=recomputed,
        num_remaining=remaining,
        kv_bytes=kv_bytes,
        duration_s=time.monotonic() - started,
    )


def _movable(calls: Calls, cell_id: str) -> list[CallRun]:
    """The cell's calls still generating there and not already being moved."""
    return [
        r
        for r in list(calls.in_flight.values())
        if r.generation.route.cell_id == cell_id and not r.generation.migrating and not r.generation.done
    ]


async def _move(
    calls: Calls, run: CallRun, *, cell_id: str, target_cells: Collection[str], deadline: float
) -> tuple[str, int]:
    """('migrated' | 'recomputed' | 'finished' | 'stuck', KV bytes moved) for one call."""
    gen = run.generation
    source = gen.route
    target = await calls.router.pick_target(
        exclude_cell=cell_id, allowed_cells=target_cells, min_version=gen.min_version
    )
    if target is None:
        return "stuck", 0
    src = calls.router.pool.stub(source.address)
    gen.migrating = True  # until the generation picks the move up (Generation.tokens clears it)
    try:
        paused = await src.PauseGeneration(
            engine_pb2.PauseGenerationRequest(request_id=gen.call_id),
            timeout=max(deadline - time.monotonic(), 0.1),
        )
    except grpc.aio.AioRpcError as exc:  # finished meanwhile, or the engine is gone
        gen.migrating = False
        log.info("pause_failed", call_id=gen.call_id, error=exc.code().name)
        return ("finished", 0) if gen.done else ("stuck", 0)
    size = await _transfer(calls, gen.call_id, source=source, target=target)
    await _cancel_quietly(calls, source, gen.call_id)
    calls.router.sticky[run.execution_id] = target.engine_id
    gen.move_to(Move(route=target, resume=size is not None, output=paused.tokens))
    log.info(
        "call_migrated",
        call_id=gen.call_id,
        source=source.engine_id,
        target=target.engine_id,
        kv_bytes=size,
    )
    return ("migrated", size) if size is not None else ("recomputed", 0)


async def _transfer(calls: Calls, call_id: str, *, source: Route, target: Route) -> int | None:
    """Pipe ExportKV into ImportKV; the bytes moved, or None when the KV could not travel."""
    src = calls.router.pool.stub(source.address)
    dst = calls.router.pool.stub(target.address)
    exported = src.ExportKV(engine_pb2.ExportKVRequest(request_id=call_id))

    async def relay() -> AsyncIterator[engine_pb2.ImportKVRequest]:
        async for part in exported:
            if part.HasField("header"):
                yield engine_pb2.ImportKVRequest(header=part.header)
            else:
                yield engine_pb2.ImportKVRequest(chunk=part.chunk)

    try:
        imported = await dst.ImportKV(relay())
    except grpc.aio.AioRpcError as exc:
        log.warning("kv_transfer_failed", call_id=call_id, error=f"{exc.code().name} {exc.details()}")
        return None
    return int(imported.kv.size_bytes)


async def _cancel_quietly(calls: Calls, route: Route, call_id: str) -> None:
    try:
        await calls.router.pool.stub(route.address).CancelGeneration(
            engine_pb2.CancelGenerationRequest(request_id=call_id), timeout=5
        )
    except grpc.aio.AioRpcError as exc:
        log.info("cancel_after_export_failed", call_id=call_id, error=exc.code().name)
