"""The step loop: B ready groups -> samples -> step -> checkpoint -> weights -> one commit (shell).

Order matters for restarts: the checkpoint and weights are written before the transaction that
marks the groups consumed, records the step and enqueues `StepCompleted` and `WeightsPublished`.
A crash before that commit leaves the groups queued and the next process trains them again from
the previous checkpoint; after it, they are never taken again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

import structlog
from google.protobuf import json_format
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.common.v1 import envelope_pb2, ids_pb2
from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import InvalidArgument, Unavailable
from gyre.events import new_event
from gyre.outages import is_outage
from gyre.trainer.v1 import events_pb2
from gyre.trajectory.v1 import trajectory_pb2
from services.trainer import repo
from services.trainer.checkpoint import checkpoint_folder, prune_checkpoints, save_checkpoint
from services.trainer.config import TrainerSettings
from services.trainer.core_cell import CoreCell
from services.trainer.dp import StepFailed
from services.trainer.microbatch import oversized_trajectories
from services.trainer.source import TrajectorySamples
from services.trainer.steps import OptimConfig
from services.trainer.weights import PublishedWeights, publish

log = structlog.get_logger(__name__)
COMMIT_TRIES = 10_000
PRODUCER = "trainer"


def version_proto(v: int) -> ids_pb2.PolicyVersion:
    return ids_pb2.PolicyVersion(steps=v)


def weights_published(weights: PublishedWeights, *, event_id: str | None = None) -> envelope_pb2.Envelope:
    return new_event(
        events_pb2.WeightsPublished(
            version=version_proto(weights.version),
            source_uri=weights.source_uri,
            sha256=weights.sha256,
            size_bytes=weights.size_bytes,
        ),
        producer=PRODUCER,
        correlation_id=f"step-{weights.version}",
        event_id=event_id,
    )


async def announce_initial_weights(
    sessions: async_sessionmaker[AsyncSession], relay: OutboxRelay, weights: PublishedWeights
) -> None:
    """`WeightsPublished` for version 0, so engines can start from the trainer's initial weights.

    The event id follows from the file's hash: restarting before the first step announces the
    same weights again under the same id, which the outbox (unique event ids) keeps once.
    """
    event_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"gyre-trainer:weights:v0:{weights.sha256}"))
    async with sessions() as session, session.begin():
        if not await repo.outbox_has(session, event_id):
            await enqueue(session, repo.outbox, weights_published(weights, event_id=event_id))
    relay.poke()


def batch_recipe(
    request: trajectory_pb2.StreamSamplesRequest, *, trainer_version: int, config: OptimConfig
) -> dict[str, Any]:
    """What `gyre replay step N` needs to re-derive the batch: the samples request, sent again,
    and the staleness rule that chose which fetched samples were trained."""
    return {
        "samples_request": json_format.MessageToDict(request),
        "staleness": {
            "trainer_version": trainer_version,
            "max_staleness_steps": config.max_staleness_steps,
            "action": str(config.staleness_action),
        },
    }


class StepLoop:
    def __init__(
        self,
        *,
        settings: TrainerSettings,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        cell: CoreCell,
        source: TrajectorySamples,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.relay = relay
        self.cell = cell
        self.source = source
        self.wake = asyncio.Event()
        self.groups_in_step = 0
        self.step_started_at: datetime | None = None
        self.num_queued = 0

    def poke(self) -> None:
        self.wake.set()

    async def _take_groups(self) -> list[repo.QueuedGroup]:
        b = self.settings.groups_per_step
        async with self.sessions() as session:
            queued = await repo.queued_groups(session)
            if self.settings.steps_from_scheduler:
                # The scheduler's policy says which groups form this step (earliest deadline
                # first); an assignment to an earlier step that is still queued comes first.
                assigned = await repo.assigned_groups(session, up_to_step=self.cell.trainer.version)
                self.num_queued = len(queued)
                return assigned[:b] if len(assigned) >= b else []
        self.num_queued = len(queued)
        return queued[:b] if len(queued) >= b else []

    async def run(self, stop: asyncio.Event) -> None:
        backoff_s = 0.5
        while not stop.is_set():
            try:
                backoff_s = await self._once(backoff_s)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # Postgres away (a restart): the loop waits, the process lives.
                log.warning("trainer_database_unavailable", error=type(exc).__name__, retry_s=backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(30.0, backoff_s * 2)

    async def _once(self, backoff_s: float) -> float:
        """One turn of the loop: wait for groups, or train one step; returns the next back-off."""
        groups = await self._take_groups()
        if not groups:
            self.wake.clear()
            try:
                await asyncio.wait_for(self.wake.wait(), timeout=0.5)
            except TimeoutError:
                pass
            return backoff_s
        if await self._set_aside_exhausted(groups):
            return backoff_s
        task_ids = [g.task_id for g in groups]
        async with self.sessions() as session, session.begin():
            await repo.count_attempt(session, task_ids)  # before the step: a crash in it counts
        try:
            await self.train(groups)
            backoff_s = 0.5
        except Exception as exc:
            if not (isinstance(exc, (Unavailable, StepFailed, InvalidArgument)) or is_outage(exc)):
                await self._failed(task_ids, exc, backoff_s)
                return min(30.0, backoff_s * 2)
            # Trajectory service or Postgres away, members dying, a batch this configuration
            # refuses: not an error of the groups' own, so the attempt is taken back and they stay
            # queued.
            async with self.sessions() as session, session.begin():
                await repo.count_attempt(session, task_ids, delta=-1)
            log.warning("step_postponed", error=str(exc), retry_s=backoff_s)
            await asyncio.sleep(backoff_s)
            backoff_s = min(30.0, backoff_s * 2)
        return backoff_s

    async def _failed(self, task_ids: list[str], exc: Exception, backoff_s: float) -> None:
        """An error of the step itself: counted against its groups."""
        error = f"{type(exc).__name__}: {exc}"
        async with self.sessions() as session, session.begin():
            await repo.record_error(session, task_ids, error)
        log.error("step_failed", task_ids=task_ids, error=error, retry_s=backoff_s, exc_info=exc)
        self.groups_in_step, self.step_started_at = 0, None
        await asyncio.sleep(backoff_s)

    async def _set_aside_exhausted(self, groups: list[repo.QueuedGroup]) -> bool:
        """Set aside the groups tried `max_group_attempts` times, with the reason; whether any was.

        A step holds B groups and one of them may be what fails it: each group counts every step
        tried with it, so with B > 1 a group that shared steps with a failing one can be set
        aside with it."""
        exhausted = [g for g in groups if g.attempts >= self.settings.max_group_attempts]
        for group in exhausted:
            reason = group.last_error or "the trainer process died while training it"
            async with self.sessions() as session, session.begin():
                await repo.set_aside(session, group.task_id)
                await self._announce_set_aside(session, group, reason)
            log.error("group_set_aside", task_id=group.task_id, attempts=group.attempts, reason=reason)
        if exhausted:
            self.relay.poke()
        return bool(exhausted)

    async def _consume_without_step(self, groups: list[repo.QueuedGroup]) -> None:
        """Groups with nothing to train on (no execution made a model call) leave the queue, said
        aloud: left there they would hold back every later group. `GroupSetAside` tells the
        scheduler, whose step would otherwise wait for them."""
        version = self.cell.trainer.version
        async with self.sessions() as session, session.begin():
            await repo.consume_groups(session, task_ids=[g.task_id for g in groups], version=version)
            for group in groups:
                await self._announce_set_aside(session, group, "no execution of the group made a model call")
        self.relay.poke()
        log.warning("groups_consumed_without_samples", task_ids=[g.task_id for g in groups], version=version)

    async def _set_aside_oversized(self, groups: list[repo.QueuedGroup], oversized: dict[str, str]) -> None:
        """A group with a trajectory no configuration of this trainer can hold is set aside with
        the reason: postponed, its step would be retried forever. The step's other groups stay
        queued; the scheduler gives the step another group in place of this one."""
        for group in groups:
            reasons = [oversized[e] for e in group.execution_ids if e in oversized]
            if not reasons:
                continue
            async with self.sessions() as session, session.begin():
                await repo.set_aside(session, group.task_id)
                await self._announce_set_aside(session, group, reasons[0])
            log.error("group_set_aside", task_id=group.task_id, reason=reasons[0])
        self.relay.poke()
        self.groups_in_step, self.step_started_at = 0, None

    @staticmethod
    async def _announce_set_aside(session: AsyncSession, group: repo.QueuedGroup, reason: str) -> None:
        event = new_event(
            events_pb2.GroupSetAside(task_id=group.task_id, reason=reason, attempts=group.attempts),
            producer=PRODUCER,
            correlation_id=group.task_id,
        )
        await enqueue(session, repo.outbox, event)

    async def train(self, groups: list[repo.QueuedGroup]) -> None:
        task_ids = [g.task_id for g in groups]
        self.groups_in_step = len(groups)
        self.step_started_at = datetime.now(UTC)
        samples = await self.source.fetch(task_ids)
        request = self.source.request_for(task_ids)
        trainer = self.cell.trainer
        oversized = oversized_trajectories(samples, max_sample_tokens=trainer.max_sample_tokens)
        if oversized:
            await self._set_aside_oversized(groups, oversized)
            return
        if not samples:
            await self._consume_without_step(groups)
            return
        report = await asyncio.to_thread(trainer.step, samples)
        version = report.version
        saved = await asyncio.to_thread(
            save_checkpoint,
            trainer.model,
            trainer.optimizer,
            checkpoint_folder(self.cell.checkpoints_root, version),
            version=version,
            base=self.cell.base,
        )
        weights = await asyncio.to_thread(
            publish, trainer.model, self.cell.weights_root, version=version, base=self.cell.base
        )
        events = [
            new_event(
                events_pb2.StepCompleted(
                    version=version_proto(version),
                    num_groups_consumed=len(groups),
                    task_ids=task_ids,
                    num_samples=report.num_samples,
                    num_target_tokens=report.num_target_tokens,
                    staleness_mean_steps=report.staleness_mean_steps,
                    staleness_max_steps=report.staleness_max_steps,
                    loss=report.loss,
                    grad_norm=report.grad_norm,
                    max_dp_world_size=report.max_dp_world_size,
                    duration_s=report.duration_s,
                    num_samples_dropped_stale=report.num_dropped_stale,
                ),
                producer=PRODUCER,
                correlation_id=f"step-{version}",
            ),
            weights_published(weights),
            *(
                new_event(
                    events_pb2.SatelliteLeft(
                        cell_id=cell,
                        reason=events_pb2.LEAVE_REASON_LOST,
                        target_version=version_proto(version),
                    ),
                    producer=PRODUCER,
                    correlation_id=f"step-{version}",
                )
                for cell in report.lost_cells
            ),
        ]
        recipe = batch_recipe(request, trainer_version=version - 1, config=trainer.config)
        # The model in memory is at `version` now: the commit is retried while Postgres is away,
        # never the step (that would train these groups twice).
        for attempt in range(COMMIT_TRIES):  # at most 5 s apart: half a day of outage
            try:
                async with self.sessions() as session, session.begin():
                    await repo.record_step(
                        session,
                        version=version,
                        task_ids=task_ids,
                        checkpoint_uri=saved.uri,
                        weights_uri=weights.source_uri,
                        report=dataclasses.asdict(report),
                        batch_sha256=report.batch_sha256,
                        batch_recipe=recipe,
                    )
                    await enqueue(session, repo.outbox, *events)
                break
            except Exception as exc:
                if not is_outage(exc):  # an outage is waited out, however long
                    raise RuntimeError(f"step {version} trained but not recorded: {exc}") from exc
                log.warning("step_commit_retried", version=version, attempt=attempt, error=type(exc).__name__)
                await asyncio.sleep(min(0.5 * 2**attempt, 5.0))
        self.relay.poke()
        self.cell.weights_uri = weights.source_uri
        self.groups_in_step = 0
        self.step_started_at = None
        prune_checkpoints(self.cell.checkpoints_root, keep=self.settings.keep_checkpoints)
        log.info(
            "step_completed",
            version=version,
            groups=len(groups),
            samples=report.num_samples,
            dropped_stale=report.num_dropped_stale,
            staleness_mean=report.staleness_mean_steps,
            staleness_max=report.staleness_max_steps,
            loss=report.loss,
            dp_world=report.max_dp_world_size,
            attempts=report.attempts,
            lost=list(report.lost_cells),
            duration_s=round(report.duration_s, 3),
        )
