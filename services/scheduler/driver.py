"""The live driver: facts from the tables -> the mode's policy -> decisions applied (shell).

On every change (a lifecycle event, a submission, a cell registered or switched) and at least
every `tick_s`, the driver rebuilds the facts (`live_facts`), builds the `ClusterView` and calls
the mode's decision function (`live_policy`, the same functions `gyre sim` runs). It applies:

- **admit**: the oldest queued tasks are admitted at the current version, their executions
  scheduled (`ExecutionScheduled`, one transaction with the state change): admission is the
  policy's, within its staleness cap;
- **assign**: the groups are recorded as assigned to the running step (`tasks.assigned_step`) and
  `StepAssigned` tells the trainer (with `GYRE_TRAINER_STEPS_FROM_SCHEDULER`, as the stack runs
  it, the trainer trains exactly those groups in that step: earliest deadline first);
- **to_training**: the rollout cells `migration.plan_drain` frees (fewest in-flight calls, per the
  proxy) switch through `CellControl.switch`;
- **to_rollout**: training satellites (highest id first, as the simulator picks) switch back.

A satellite the trainer lost (`SatelliteLeft` with `LEAVE_REASON_LOST`: it died, or a join never
took its epoch up) is out of training while its table row still says `training`; the driver
switches it back to rollout (the trainer's leave answers NOT_FOUND, then weights and route), so
it ends in a role it holds. One that is truly gone fails that switch and is reported lost.

Each round also runs the lost-execution `watchdog` (at most every few seconds): an execution no
runner reports an end for is cancelled, then ended as an infrastructure failure.

Switches run as tasks of their own (the cell shows `switching` meanwhile), so admissions go on.

A mode set while a step runs (`SetMode` keeps it pending) takes effect at the first decision
after that step completed, before anything is assigned to the next one: modes change strictly
between steps. In async, every round sends training satellites back to rollout (a fixed split
never moves them: `policy.liveness.misplaced_satellites`), however the mode was reached.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import grpc
import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.common.v1.envelope_pb2 import Envelope
from gyre.consume import ConsumerSpec
from gyre.db.outbox import OutboxRelay, enqueue
from gyre.events import DecodedEvent, new_event
from gyre.ids import new_uuid7
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.scheduler.v1 import events_pb2
from gyre.tls import aio_channel
from gyre.trainer.v1 import events_pb2 as trainer_events
from services.scheduler import repo
from services.scheduler.cell_control import PRODUCER, CellControl
from services.scheduler.cells import CellRecord, parse_mode
from services.scheduler.codec import execution_scheduled, task_to_proto
from services.scheduler.config import SchedulerSettings
from services.scheduler.live_facts import Queued, load_cluster, load_facts
from services.scheduler.live_policy import policy_for
from services.scheduler.metrics import DECISION_SECONDS
from services.scheduler.policy.liveness import SatelliteRole, misplaced_satellites
from services.scheduler.policy.migration import plan_drain
from services.scheduler.policy.state import Decision, PolicyConfig
from services.scheduler.tasks import execution_limit_s
from services.scheduler.watchdog import Watchdog

log = structlog.get_logger(__name__)


class LiveDriver:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        control: CellControl,
        settings: SchedulerSettings,
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.control = control
        self.settings = settings
        self.wake = asyncio.Event()
        self.switches: set[asyncio.Task[None]] = set()
        self.switching: set[str] = set()
        """Cells with a switch task of this driver in flight (`control.switching` is set only
        once the task runs, so a round in between must not start a second one)."""
        self.decisions = 0
        self.watchdog = Watchdog(sessions, relay, settings)

    def poke(self) -> None:
        self.wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.wake.clear()
            try:
                with DECISION_SECONDS.time():
                    await self.decide_once()
                await self.watchdog.check_if_due()
            except grpc.aio.AioRpcError as exc:  # the proxy is away: decide again at the next tick
                log.warning("driver_proxy_unreachable", error=exc.code().name)
            except Exception:  # a bad decision round must not stop the scheduler serving its RPCs
                log.exception("driver_decision_failed")
            waiter = asyncio.ensure_future(self.wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait(
                {waiter, stopper}, timeout=self.settings.tick_s, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            stopper.cancel()
        for task in list(self.switches):
            await asyncio.gather(task, return_exceptions=True)

    def spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable="scheduler-lost-satellites",
            producer="trainer",
            handlers={trainer_events.SatelliteLeft: self.on_satellite_left},
            database=self.sessions,
        )

    async def on_satellite_left(self, event: DecodedEvent) -> None:
        p: trainer_events.SatelliteLeft = event.payload
        if p.reason != trainer_events.LEAVE_REASON_LOST or p.cell_id in self.control.switching:
            return
        async with self.sessions() as session:
            cell = next((c for c, _ in await repo.load_cells(session) if c.cell_id == p.cell_id), None)
        if cell is not None and cell.role == "training" and not cell.core:
            log.warning("lost_satellite_back_to_rollout", cell_id=cell.cell_id)
            self._switch(cell, "rollout")

    async def decide_once(self) -> Decision | None:
        s = self.settings
        async with self.sessions() as session, session.begin():
            applied = await self.control.apply_pending_mode(session)
            cluster = await load_cluster(session, default_mode=s.mode)
            cells = [c for c, _ in await repo.load_cells(session) if c.role != "lost"]
            satellites = [c for c in cells if not c.core]
            if applied:
                self.relay.poke()
            self._restore_roles(cluster.mode, satellites)
            if not satellites or not any(c.core for c in cells):
                return None  # no cluster to decide for yet
            if cluster.mode == "colocate":
                # Colocate's pool has no core: every cell of it alternates. Live the core cell
                # cannot serve (it has no engine), so the pool is the satellites and the core
                # trains beside them in every step.
                cells = satellites
            slots = min(c.slots for c in satellites)
            facts, queued = await load_facts(
                session,
                cluster=cluster,
                cells=cells,
                slots_per_cell=slots,
                tokens_per_group=cluster.tokens_per_group(guess=s.tokens_per_group_guess),
                tokens_per_s_per_cell=cluster.tokens_per_s_per_cell(guess=s.tokens_per_s_per_cell_guess),
            )
        config = PolicyConfig(
            num_cells=len(cells),
            slots_per_cell=slots,
            groups_per_step=s.groups_per_step,
            group_size=queued[0].group_size if queued else facts.group_size,
            max_staleness=s.max_staleness,
            total_groups=facts.total_groups,
            step_overhead_s=s.step_overhead_s,
            rollout_to_training_s=self.control.measured_switch_s("training", default=s.rollout_to_training_s),
            training_to_rollout_s=self.control.measured_switch_s("rollout", default=s.training_to_rollout_s),
            tokens_per_s_per_cell=facts.tokens_per_s_per_cell,
        )
        decision = policy_for(parse_mode(cluster.mode), config)(facts.view(time.time()))
        if decision.is_noop:
            return decision
        self.decisions += 1
        if decision.admit and s.admission == "paced":
            await self._admit(queued[: decision.admit], version=cluster.version)
        if decision.assign:
            await self._assign(decision.assign, step=cluster.version)
        if decision.to_training:
            await self._to_training([c for c in cells if c.role == "rollout"], decision.to_training, slots)
        if decision.to_rollout:
            training = sorted(
                (c for c in satellites if c.role == "training"), key=lambda c: c.cell_id, reverse=True
            )
            for cell in training[: decision.to_rollout]:
                self._switch(cell, "rollout")
        log.info(
            "policy_decided",
            mode=cluster.mode,
            version=cluster.version,
            admit=decision.admit,
            assign=list(decision.assign),
            to_training=decision.to_training,
            to_rollout=decision.to_rollout,
        )
        return decision

    async def _admit(self, tasks: list[Queued], *, version: int) -> None:
        async with self.sessions() as session, session.begin():
            events = []
            for queued in tasks:
                events += await admit_task(session, queued, version=version)
            await enqueue(session, repo.outbox, *events)
        self.relay.poke()

    async def _assign(self, seqs: tuple[int, ...], *, step: int) -> None:
        async with self.sessions() as session, session.begin():
            task_ids = await repo.assign_step(session, seqs=seqs, step=step)
            event = events_pb2.StepAssigned(step=step, task_ids=task_ids)
            await enqueue(
                session, repo.outbox, new_event(event, producer=PRODUCER, correlation_id=f"step-{step}")
            )
        self.relay.poke()

    async def _to_training(self, rollout: list[CellRecord], count: int, slots: int) -> None:
        async with aio_channel(self.settings.proxy_address) as channel:
            routing = await proxy_pb2_grpc.ProxyServiceStub(channel).GetRouting(  # type: ignore[misc]
                proxy_pb2.GetRoutingRequest(), timeout=10
            )
        in_flight: dict[str, int] = {}
        for route in routing.routes:
            in_flight[route.cell_id] = in_flight.get(route.cell_id, 0) + route.num_in_flight_calls
        loads = {i: in_flight.get(c.cell_id, 0) for i, c in enumerate(rollout)}
        plan = plan_drain(loads=loads, slots_per_cell=slots, count=count)
        for index in plan.freed:
            self._switch(rollout[index], "training")

    def _restore_roles(self, mode: str, satellites: list[CellRecord]) -> None:
        """Every round, not only when a mode is applied: a mode set between steps takes effect
        in SetMode itself, and a switch that ended in the old role must be redone."""
        roles = [SatelliteRole(cell_id=c.cell_id, role=c.role) for c in satellites]
        misplaced = set(misplaced_satellites(mode, roles))
        for cell in satellites:
            busy = self.switching | self.control.switching
            if cell.cell_id in misplaced and cell.cell_id not in busy:
                log.info("satellite_back_to_rollout", cell_id=cell.cell_id, mode=mode)
                self._switch(cell, "rollout")

    def _switch(self, cell: CellRecord, role: str) -> None:
        async def run() -> None:
            try:
                await self.control.switch(cell, to=role, request_id=new_uuid7(), cause="policy")
            except Exception:  # a refused switch (already switching, no core): the next decision sees it
                log.exception("policy_switch_refused", cell_id=cell.cell_id, role=role)
            finally:
                self.switching.discard(cell.cell_id)
            self.poke()

        self.switching.add(cell.cell_id)

        task = asyncio.create_task(run())
        self.switches.add(task)
        task.add_done_callback(self.switches.discard)


async def admit_task(session: AsyncSession, queued: Queued, *, version: int) -> list[Envelope]:
    """Mark a queued task admitted at `version`; its ExecutionScheduled events, to enqueue. A task
    whose deadline has passed while it waited is cancelled instead (nothing to enqueue)."""
    found = await repo.load_task(session, str(queued.task_id))
    assert found is not None
    planned, _ = found
    now = datetime.now(UTC)
    limit_s = execution_limit_s(planned.spec, now=now)
    if limit_s <= 0:
        await repo.cancel_queued(session, queued.task_id)
        log.warning("task_deadline_passed_while_queued", task_id=str(queued.task_id))
        return []
    await repo.admit_task(session, queued.task_id, version=version)
    task = task_to_proto(planned)
    return [
        new_event(
            execution_scheduled(task, execution, admitted_version=version, timeout_s=limit_s),
            producer=PRODUCER,
            correlation_id=task.task_id,
            causation_id=f"admitted-v{version}",
        )
        for execution in task.executions
    ]
