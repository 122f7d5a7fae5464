"""Gather what `gyre report` draws from the live services and the bus's history (shell).

From the public APIs (the typed client): the trainer's steps (`GetStep`, each with its staleness
rule and the request that fetched its samples), the trajectory service's groups, samples and
one execution's tree. From the bus (read-only ephemeral consumers on the producers' streams):
`TaskSubmitted` for the tasks and their labels (the scheduler has no `ListTasks`),
`RewardAssigned` for the per-check grades (no service keeps them behind an RPC), and, where the
scheduler contract has cells (issue 12), `CellRegistered` / `CellRoleChanged` for the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from google.protobuf import message
from nats.js import api
from nats.js.errors import NotFoundError

from gyre.bus import Bus
from gyre.errors import GyreError, NotFound
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import UndecodableEvent, parse_envelope, stream_name, subject_for, unpack_payload
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.trainer.v1 import trainer_pb2
from gyre_app.client import GyreClient
from gyre_app.report_model import (
    HELDOUT,
    Report,
    StepRow,
    TreeLane,
    cell_segments,
    check_shares,
    heldout_scores,
    mean_or_none,
)
from gyre_app.staleness import distribution
from services.trainer.samples import staleness_steps
from services.trainer.source import samples_from_response

FETCH_BATCH = 256
HISTORY_TIMEOUT_S = 2.0
"""How long to wait for the next batch of a stream's history before taking it as read."""


async def history(bus: Bus, service: str, kind: type[message.Message]) -> list[tuple[datetime, Any]]:
    """Every `kind` event in `service`'s stream, oldest first, with when it occurred.

    An ephemeral consumer that acknowledges nothing, so no service's durable consumer is touched.
    """
    event_type = kind.DESCRIPTOR.full_name
    stream = stream_name(service, prefix=bus.prefix)
    try:
        info = await bus.js.stream_info(stream)
    except NotFoundError:
        return []  # the service never published anything under this prefix
    last = info.state.last_seq
    config = api.ConsumerConfig(
        ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=30.0
    )
    sub = await bus.js.pull_subscribe(
        subject_for(event_type, prefix=bus.prefix), stream=stream, config=config
    )
    out: list[tuple[datetime, Any]] = []
    try:
        while True:  # bounded: the stream's last sequence at the start, or a batch that never comes
            try:
                msgs = await sub.fetch(FETCH_BATCH, timeout=HISTORY_TIMEOUT_S)
            except TimeoutError:
                break
            for msg in msgs:
                try:
                    envelope = parse_envelope(msg.data)
                    event = unpack_payload(envelope, await bus.load_payload(envelope), {event_type: kind})
                except UndecodableEvent:
                    continue
                if event is not None:
                    out.append((envelope.occurred_at.ToDatetime(tzinfo=UTC), event.payload))
            if not msgs or msgs[-1].metadata.sequence.stream >= last:
                break
    finally:
        await sub.unsubscribe()
    return out


async def _steps(client: GyreClient) -> list[trainer_pb2.Step]:
    version = int((await client.trainer_status()).version.steps)
    steps = []
    for v in range(1, version + 1):
        try:
            steps.append(await client.step(v))
        except NotFound:  # a version the trainer published without a recorded step (restored)
            continue
    return steps


async def _staleness(client: GyreClient, steps: Sequence[trainer_pb2.Step]) -> dict[int, int]:
    """Each step's samples, as its recorded request fetches them again, by staleness at consumption."""
    values: list[int] = []
    for step in steps:
        if not step.HasField("samples_request"):
            continue
        fetched: tuple[Any, ...] = ()
        for response in await client.stream_samples(step.samples_request):
            fetched += samples_from_response(response, index=len(fetched))
        trainer_version = step.staleness.trainer_version.steps
        values += [staleness_steps(s, trainer_version=trainer_version) for s in fetched]
    return distribution(values)


async def _tree(client: GyreClient, execution_id: str) -> tuple[TreeLane, ...]:
    tree = await client.execution_tree(execution_id)
    calls = {c.call_id: c for c in tree.calls}
    return tuple(
        TreeLane(
            trajectory_id=t.trajectory_id,
            role=t.agent_role,
            seqs=tuple(calls[c].seq for c in t.call_ids if c in calls),
            output_tokens=tuple(calls[c].num_output_tokens for c in t.call_ids if c in calls),
            selected=t.selected,
            shared_prefix_with=t.shared_prefix_with,
            num_shared_prefix_tokens=t.num_shared_prefix_tokens,
        )
        for t in tree.trajectories
    )


async def _cells(bus: Bus) -> tuple[list[tuple[datetime, str, str]], str]:
    """(time, cell, role) changes from the scheduler's cell events; a note when there are none."""
    registered = getattr(scheduler_events, "CellRegistered", None)
    changed = getattr(scheduler_events, "CellRoleChanged", None)
    if registered is None or changed is None:
        return [], "this scheduler contract has no cells (issue 12 adds them): no cell-role timeline"
    role_name = scheduler_pb2.CellRole.Name  # type: ignore[attr-defined]
    changes = [
        (at, e.cell.cell_id, role_name(e.cell.role).removeprefix("CELL_ROLE_").lower())
        for at, e in await history(bus, "scheduler", registered)
    ]
    changes += [
        (
            at,
            e.switch.cell_id,
            role_name(e.switch.to_role).removeprefix("CELL_ROLE_").lower(),
        )
        for at, e in await history(bus, "scheduler", changed)
    ]
    return changes, "" if changes else "the scheduler published no cell events: no cell-role timeline"


async def gather(
    client: GyreClient,
    bus: Bus,
    *,
    run: str = "",
    execution_id: str = "",
    heldout: Mapping[int, float] | None = None,
) -> Report:
    """The report of `run` (every step when empty); `NotFound` naming what is missing.

    `heldout` (policy version -> mean score) replaces the scores of held-out tasks submitted to the
    scheduler, for a run that scored its held-out split outside the stack (`gyre demo --learn`).
    """
    submitted = [t.task for _, t in await history(bus, "scheduler", scheduler_events.TaskSubmitted)]
    labels = {t.task_id: dict(t.spec.labels) for t in submitted}
    steps = await _steps(client)
    if run:
        mine = {tid for tid, lab in labels.items() if lab.get("run") == run}
        if not mine:
            raise NotFound(f"no run {run!r}: no task submitted under this bus prefix is labelled run={run}")
        steps = [s for s in steps if mine & set(s.task_ids)]
    else:
        mine = set(labels) | {tid for s in steps for tid in s.task_ids}
    if not steps:
        raise NotFound(
            f"run {run!r} has trained no step yet: nothing to report"
            if run
            else "the trainer has recorded no step yet: nothing to report"
        )
    groups = {}
    for tid in sorted(mine):
        try:
            groups[tid] = await client.group(tid)
        except NotFound:  # submitted, not yet known to the trajectory service
            continue

    def is_heldout(task_id: str) -> bool:
        return labels.get(task_id, {}).get("split") == HELDOUT

    rows = []
    for s in steps:
        train = [groups[t] for t in s.task_ids if t in groups and not is_heldout(t)]
        rewards = [e.reward for g in train for e in g.executions if e.has_reward and e.assessable]
        rows.append(
            StepRow(
                version=int(s.version.steps),
                reward_mean=mean_or_none(rewards),
                num_rewards=len(rewards),
                num_unassessable=sum(g.num_unassessable for g in train),
                loss=s.loss,
                staleness_mean=s.staleness_mean_steps,
                staleness_max=s.staleness_max_steps,
            )
        )
    heldout_points = []
    for tid, g in groups.items():
        if not is_heldout(tid) or "heldout_at" not in labels[tid]:
            continue
        at = int(labels[tid]["heldout_at"])
        heldout_points += [(at, e.reward) for e in g.executions if e.has_reward and e.assessable]

    run_executions = {e.execution_id for g in groups.values() for e in g.executions}
    grades = [
        g.grade
        for _, g in await history(bus, "evaluator", evaluator_events.RewardAssigned)
        if g.grade.execution_id in run_executions
    ]
    assessable = [g for g in grades if g.assessable]

    notes: dict[str, str] = {}
    if heldout is not None:
        heldout_points = list(heldout.items())
    if not heldout_points:
        notes["heldout"] = "this run scored no held-out task (tasks labelled split=heldout, heldout_at=N)"
    if not execution_id:
        last = [groups[t] for t in steps[-1].task_ids if t in groups]
        scored = sorted(
            ((e.reward, e.execution_id) for g in last for e in g.executions if e.has_reward),
            reverse=True,
        )
        execution_id = scored[0][1] if scored else ""
    lanes: tuple[TreeLane, ...] = ()
    if execution_id:
        try:
            lanes = await _tree(client, execution_id)
        except GyreError as exc:
            notes["tree"] = f"no tree for execution {execution_id}: {exc}"
    else:
        notes["tree"] = "the last step's groups have no rewarded execution to draw"
    changes, cells_note = await _cells(bus)
    if cells_note:
        notes["cells"] = cells_note
    return Report(
        run=run,
        steps=tuple(rows),
        heldout=heldout_scores(heldout_points),
        staleness=await _staleness(client, steps),
        checks=check_shares([(c.name, c.score, c.weight) for c in g.checks] for g in assessable),
        num_grades=len(grades),
        num_unassessable=len(grades) - len(assessable),
        num_partial=sum(g.partial for g in assessable),
        num_replacements=sum(1 for g in groups.values() for e in g.executions if e.replaces),
        tree_execution=execution_id,
        tree_lanes=lanes,
        cells=cell_segments(changes, until=datetime.now(UTC)),
        notes=notes,
    )
