"""Replaying a service's outbox into a scratch schema (the evaluator's rewards, written by its real
`store_reward`), on a real Postgres database of the test's own: ranges, diffs, bad ranges."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import pytest_asyncio

from gyre.common.v1 import ids_pb2
from gyre.db.engine import libpq_url, make_engine, make_sessionmaker
from gyre.db.outbox_replay import OutboxRange, replay_outbox
from gyre.devstack.scratch import scratch_kernel
from gyre.errors import InvalidArgument, NotFound
from gyre.evaluator.v1 import evaluator_pb2
from gyre.events import new_event
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre_app.migrations import upgrade
from services.evaluator.consumer import store_reward
from services.evaluator.event_projection import PROJECTION
from services.scheduler.event_projection import PROJECTION as SCHEDULER_EVENTS

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def rewarded(server_urls: tuple[str, str]) -> AsyncIterator[tuple[asyncpg.Connection, list[str]]]:
    """Three executions rewarded through the evaluator's own write path; a connection to its database."""
    async with scratch_kernel(*server_urls, label="outbox_replay") as kernel:
        assert kernel.database_url is not None
        await asyncio.to_thread(upgrade, "evaluator", kernel.database_url)
        engine = make_engine(kernel.database_url)
        ids = [str(uuid.uuid4()) for _ in range(3)]
        task_id = str(uuid.uuid4())
        sessions = make_sessionmaker(engine)
        for i, e in enumerate(ids):
            grade = evaluator_pb2.Grade(execution_id=e, task_id=task_id, score=i / 2, assessable=i > 0)
            async with sessions() as session, session.begin():
                assert await store_reward(session, grade, request_id=f"r{i}", causation_id="c")
        await engine.dispose()
        pg = await asyncpg.connect(libpq_url(kernel.database_url))
        try:
            yield pg, ids
        finally:
            await pg.close()


async def test_the_whole_log_rebuilds_every_reward(rewarded: tuple[asyncpg.Connection, list[str]]) -> None:
    pg, _ = rewarded
    result = await replay_outbox(pg, PROJECTION, OutboxRange())
    assert result.same and result.num_events == 3
    assert [(d.table, d.num_live, d.num_replayed) for d in result.diffs] == [("rewards", 3, 3)]
    assert await pg.fetchval(f"SELECT count(*) FROM pg_namespace WHERE nspname = '{result.schema}'") == 0


async def test_a_position_rebuilds_the_rows_its_events_touch(
    rewarded: tuple[asyncpg.Connection, list[str]],
) -> None:
    pg, _ = rewarded
    result = await replay_outbox(pg, PROJECTION, OutboxRange(from_position=2))
    assert result.same and result.num_events == 1 and result.diffs[0].num_replayed == 1


async def test_a_row_changed_behind_the_log_is_reported(
    rewarded: tuple[asyncpg.Connection, list[str]],
) -> None:
    pg, ids = rewarded
    key = uuid.UUID(ids[1])
    await pg.execute("UPDATE evaluator.rewards SET score = 0.9 WHERE execution_id = $1", key)
    try:
        result = await replay_outbox(pg, PROJECTION, OutboxRange())
    finally:
        await pg.execute("UPDATE evaluator.rewards SET score = 0.5 WHERE execution_id = $1", key)
    (diff,) = result.diffs
    assert not result.same
    assert [(r["execution_id"], r["score"]) for r in diff.only_live] == [(key, 0.9)]
    assert [(r["execution_id"], r["score"]) for r in diff.only_replayed] == [(key, 0.5)]


async def test_ranges_past_the_log_are_refused_saying_where_it_ends(
    rewarded: tuple[asyncpg.Connection, list[str]],
) -> None:
    pg, _ = rewarded
    with pytest.raises(NotFound, match=r"position 3 is past the end of the evaluator event log \(3 events"):
        await replay_outbox(pg, PROJECTION, OutboxRange(from_position=3))
    with pytest.raises(NotFound, match=r"no evaluator event recorded since .*: the log spans"):
        await replay_outbox(pg, PROJECTION, OutboxRange(since=datetime.now(UTC) + timedelta(hours=1)))
    with pytest.raises(InvalidArgument, match="from_position: must be >= 0"):
        await replay_outbox(pg, PROJECTION, OutboxRange(from_position=-1))


async def test_a_range_after_a_tasks_submission_still_touches_it_by_its_step() -> None:
    """The scheduler's fold: StepAssigned in the range names a task submitted before it."""
    task_id, execution_id = str(uuid.uuid4()), str(uuid.uuid4())
    task = scheduler_pb2.Task(
        task_id=task_id,
        spec=scheduler_pb2.TaskSpec(
            name="t", family="terminal", prompt="p", group_size=1, harness="gyre-agent"
        ),
        executions=[ids_pb2.ExecutionRef(task_id=task_id, execution_id=execution_id)],
    )
    task.submitted_at.FromDatetime(datetime(2026, 12, 1, tzinfo=UTC))
    events = [
        new_event(scheduler_events.TaskSubmitted(task=task), producer="scheduler", correlation_id=task_id),
        new_event(
            scheduler_events.StepAssigned(step=3, task_ids=[task_id]),
            producer="scheduler",
            correlation_id="s",
        ),
    ]
    whole, tail = SCHEDULER_EVENTS.fold(events), SCHEDULER_EVENTS.fold(events[1:])
    key = (uuid.UUID(task_id),)
    assert whole["tasks"][key][-1] == 3 and whole["tasks"][key][2] == "t"
    assert list(tail["tasks"]) == [key] and not tail["executions"]


def test_a_replacement_execution_is_rebuilt_from_its_decision() -> None:
    """The scheduler's fold: a replacement joins the executions table at the group's next index."""
    task_id, failed, spare = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    decided = scheduler_events.ExecutionReplacementDecided(
        execution=ids_pb2.ExecutionRef(task_id=task_id, execution_id=failed, index_in_group=0),
        replacement=ids_pb2.ExecutionRef(task_id=task_id, execution_id=spare, index_in_group=1),
        reason="sandbox could not be created",
    )
    none = scheduler_events.ExecutionReplacementDecided(
        execution=ids_pb2.ExecutionRef(task_id=task_id, execution_id=spare, index_in_group=1),
        reason="grader crashed; not replaced: allowance spent (1 of 1 retries used)",
    )
    folded = SCHEDULER_EVENTS.fold(
        [new_event(e, producer="scheduler", correlation_id=task_id) for e in (decided, none)]
    )
    assert folded["executions"] == {
        (uuid.UUID(spare),): (uuid.UUID(spare), uuid.UUID(task_id), 1),
    }
