"""TrainerService gRPC methods (shell: validate -> core cell -> persist with outbox -> answer)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import structlog
from google.protobuf import json_format, message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import Conflict, InvalidArgument, NotFound, Unavailable
from gyre.events import new_event
from gyre.ids import REQUEST_ID_RE, new_uuid7, validate_request_id
from gyre.rpc import Context
from gyre.trainer.v1 import events_pb2, trainer_pb2, trainer_pb2_grpc
from services.trainer import repo
from services.trainer.checkpoint import folder_size
from services.trainer.core_cell import CoreCell, path_from_uri
from services.trainer.loop import PRODUCER, StepLoop, version_proto

log = structlog.get_logger(__name__)
M = TypeVar("M", bound=message.Message)
LEAVE_WAIT_S = 120.0


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], relay: OutboxRelay, cell: CoreCell, loop: StepLoop
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.cell = cell
        self.loop = loop
        self.lock = asyncio.Lock()

    async def _first(self, method: str, request: message.Message, cls: type[M]) -> M | None:
        return await repo.requests.answered(self.sessions, method=method, request=request, cls=cls)

    async def _commit(
        self,
        method: str,
        request: message.Message,
        cls: type[M],
        answer: Callable[[AsyncSession], Awaitable[tuple[M, message.Message]]],
    ) -> M:
        """Once per request id: `answer`'s writes, its response and its event in one transaction."""
        request_id: str = getattr(request, "request_id")  # noqa: B009

        async def act(session: AsyncSession) -> M:
            response, event = await answer(session)
            envelope = new_event(event, producer=PRODUCER, correlation_id=request_id, causation_id=request_id)
            await enqueue(session, repo.outbox, envelope)
            return response

        response, fresh = await repo.requests.answer_once(
            self.sessions, method=method, request=request, cls=cls, act=act
        )
        if fresh:
            self.relay.poke()
        return response

    async def GetStatus(
        self, request: trainer_pb2.GetStatusRequest, context: Context
    ) -> trainer_pb2.GetStatusResponse:
        core = self.cell.core
        response = trainer_pb2.GetStatusResponse(
            version=version_proto(self.cell.trainer.version),
            num_groups_queued=self.loop.num_queued,
            max_staleness_steps=self.cell.trainer.config.max_staleness_steps,
            weights_uri=self.cell.weights_uri,
        )
        for rank, cell_id in enumerate(core.members()):
            role = trainer_pb2.MEMBER_ROLE_CORE if rank == 0 else trainer_pb2.MEMBER_ROLE_SATELLITE
            response.members.append(trainer_pb2.Member(cell_id=cell_id, role=role, dp_rank=rank))
        if core.step_target is not None and self.loop.step_started_at is not None:
            response.step.target_version.steps = core.step_target
            response.step.num_groups_consumed = self.loop.groups_in_step
            response.step.num_groups_target = self.loop.groups_in_step
            response.step.num_micro_batches_done = core.done_in_step
            response.step.started_at.FromDatetime(self.loop.step_started_at)
        async with self.sessions() as session:
            last = await repo.last_checkpoint(session)
        if last is not None:
            response.last_checkpoint.CopyFrom(_checkpoint_proto(last))
        return response

    async def JoinStep(
        self, request: trainer_pb2.JoinStepRequest, context: Context
    ) -> trainer_pb2.JoinStepResponse:
        validate_request_id(request.request_id)
        _validate_cell_id(request.cell_id)
        async with self.lock:
            first = await self._first("JoinStep", request, trainer_pb2.JoinStepResponse)
            if first is not None:
                return first
            ticket = self.cell.core.request_join(request.cell_id)
            response = trainer_pb2.JoinStepResponse(
                admitted=ticket.admitted,
                reason=ticket.reason,
                target_version=version_proto(ticket.target_version),
                dp_rank=ticket.dp_rank,
                dp_world_size=ticket.dp_world_size,
                rendezvous_uri=self.cell.core.rendezvous_uri,
                backend=self.cell.core.backend,
                weights_uri=self.cell.weights_uri,
            )
            event = events_pb2.SatelliteJoined(
                cell_id=request.cell_id,
                target_version=version_proto(ticket.target_version),
                dp_rank=ticket.dp_rank,
                dp_world_size=ticket.dp_world_size,
                request_id=request.request_id,
            )

            async def joined(session: AsyncSession) -> tuple[trainer_pb2.JoinStepResponse, message.Message]:
                return response, event

            response = await self._commit("JoinStep", request, trainer_pb2.JoinStepResponse, joined)
        log.info(
            "satellite_join_requested", cell_id=request.cell_id, admitted=ticket.admitted, rank=ticket.dp_rank
        )
        return response

    async def LeaveStep(
        self, request: trainer_pb2.LeaveStepRequest, context: Context
    ) -> trainer_pb2.LeaveStepResponse:
        validate_request_id(request.request_id)
        _validate_cell_id(request.cell_id)
        if request.immediate:
            raise InvalidArgument(
                "immediate", "not supported: a satellite leaves after its microbatch in progress (send false)"
            )
        first = await self._first("LeaveStep", request, trainer_pb2.LeaveStepResponse)
        if first is not None:
            return first
        future = self.cell.core.request_leave(request.cell_id)
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), timeout=LEAVE_WAIT_S)
        except KeyError:
            raise NotFound(f"cell {request.cell_id!r} is not a satellite member") from None
        except TimeoutError:
            raise Unavailable(
                f"{request.cell_id} did not reach a microbatch boundary in {LEAVE_WAIT_S} s"
            ) from None
        response = trainer_pb2.LeaveStepResponse(
            num_micro_batches_completed=result.num_micro_batches_completed,
            num_micro_batches_reassigned=result.num_micro_batches_reassigned,
        )
        event = events_pb2.SatelliteLeft(
            cell_id=request.cell_id,
            reason=events_pb2.LEAVE_REASON_REQUESTED,
            target_version=version_proto(result.target_version),
            num_micro_batches_completed=result.num_micro_batches_completed,
            num_micro_batches_reassigned=result.num_micro_batches_reassigned,
            request_id=request.request_id,
        )

        async def left(session: AsyncSession) -> tuple[trainer_pb2.LeaveStepResponse, message.Message]:
            return response, event

        return await self._commit("LeaveStep", request, trainer_pb2.LeaveStepResponse, left)

    async def SaveCheckpoint(
        self, request: trainer_pb2.SaveCheckpointRequest, context: Context
    ) -> trainer_pb2.SaveCheckpointResponse:
        """Every completed step is checkpointed; this names (or copies) the latest one."""
        validate_request_id(request.request_id)
        if request.uri and not request.uri.startswith("file://"):
            raise InvalidArgument("uri", f"must be a file:// URI or empty, got {request.uri!r}")
        first = await self._first("SaveCheckpoint", request, trainer_pb2.SaveCheckpointResponse)
        if first is not None:
            return first
        async with self.sessions() as session:
            last = await repo.last_step(session)
        if last is None:
            raise Conflict("no step has completed yet: nothing to checkpoint beyond the initial weights")
        source = path_from_uri(last.checkpoint_uri)
        target = path_from_uri(request.uri) if request.uri else source
        if target != source:
            await asyncio.to_thread(_copy_tree, source, target)
        size = folder_size(target)

        async def save(session: AsyncSession) -> tuple[trainer_pb2.SaveCheckpointResponse, message.Message]:
            """The checkpoint's row, the stored answer and CheckpointSaved: one transaction."""
            checkpoint = trainer_pb2.Checkpoint(
                checkpoint_id=new_uuid7(),
                version=version_proto(last.version),
                uri=target.resolve().as_uri(),
                size_bytes=size,
            )
            saved_at = datetime.now(UTC)
            checkpoint.saved_at.FromDatetime(saved_at)
            await repo.insert_checkpoint(
                session,
                checkpoint_id=checkpoint.checkpoint_id,
                version=last.version,
                uri=checkpoint.uri,
                size_bytes=size,
                saved_at=saved_at,
            )
            response = trainer_pb2.SaveCheckpointResponse(checkpoint=checkpoint)
            return response, events_pb2.CheckpointSaved(checkpoint=checkpoint, request_id=request.request_id)

        return await self._commit("SaveCheckpoint", request, trainer_pb2.SaveCheckpointResponse, save)

    async def GetStep(
        self, request: trainer_pb2.GetStepRequest, context: Context
    ) -> trainer_pb2.GetStepResponse:
        version = request.version.steps
        if version < 1:
            raise InvalidArgument("version.steps", f"must name a completed step, >= 1, got {version}")
        async with self.sessions() as session:
            row = await repo.load_step(session, version)
        if row is None:
            latest = self.cell.trainer.version
            raise NotFound(f"step {version} was never trained: the latest step is {latest}")
        return trainer_pb2.GetStepResponse(step=_step_proto(row))


def _step_proto(row: Any) -> trainer_pb2.Step:
    report, recipe = row.report, row.batch_recipe or {}
    step = trainer_pb2.Step(
        version=version_proto(row.version),
        task_ids=row.task_ids,
        batch_sha256=row.batch_sha256 or "",
        num_samples=report["num_samples"],
        num_samples_dropped_stale=report["num_dropped_stale"],
        staleness_mean_steps=report["staleness_mean_steps"],
        staleness_max_steps=report["staleness_max_steps"],
        loss=report["loss"],
    )
    step.completed_at.FromDatetime(row.completed_at)
    if "samples_request" in recipe:
        json_format.ParseDict(recipe["samples_request"], step.samples_request)
    if "staleness" in recipe:
        rule = recipe["staleness"]
        step.staleness.trainer_version.steps = rule["trainer_version"]
        step.staleness.max_staleness_steps = rule["max_staleness_steps"]
        step.staleness.action = rule["action"]
    return step


def _copy_tree(source: Path, target: Path) -> None:
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def _checkpoint_proto(row: object) -> trainer_pb2.Checkpoint:
    c = trainer_pb2.Checkpoint(
        checkpoint_id=str(row.checkpoint_id),  # type: ignore[attr-defined]
        version=version_proto(row.version),  # type: ignore[attr-defined]
        uri=row.uri,  # type: ignore[attr-defined]
        size_bytes=row.size_bytes,  # type: ignore[attr-defined]
    )
    c.saved_at.FromDatetime(row.saved_at)  # type: ignore[attr-defined]
    return c


def _validate_cell_id(cell_id: str) -> None:
    """A cell id travels to the rendezvous store, whose keys are short: refused here, not there."""
    if not REQUEST_ID_RE.fullmatch(cell_id):
        raise InvalidArgument(
            "cell_id", f"must name the satellite cell: 1..128 of [A-Za-z0-9_.:-], got {cell_id[:64]!r}"
        )
