"""The proxy's fair queue over render workers and the wait a refused execution serves: the pure
rules, and the render workers' accounts kept by them."""

from __future__ import annotations

import time

import pytest

from gyre.errors import InvalidArgument, Unavailable
from services.proxy.fair_queue import FairQueue, refusal_wait_s
from services.proxy.render_workers import RenderWorkers


def test_when_workers_are_short_the_execution_that_used_least_goes_first() -> None:
    queue: FairQueue[str] = FairQueue(workers=1)
    queue.submit("heavy", "h1")
    assert queue.start_next() == ("heavy", "h1")
    queue.submit("heavy", "h2")  # waits, queued before the light one
    queue.submit("light", "l1")
    assert queue.start_next() is None  # the one worker is busy
    queue.done("heavy", 0.5)
    assert queue.start_next() == ("light", "l1")  # 0 worker seconds < 0.5: ahead of h2
    queue.done("light", 0.01)
    assert queue.start_next() == ("heavy", "h2")
    queue.done("heavy", 0.5)


def test_a_flood_of_heavy_jobs_cannot_keep_a_light_execution_waiting() -> None:
    queue: FairQueue[str] = FairQueue(workers=2)
    order: list[str] = []
    for i in range(6):  # two heavy executions keep a job queued each, always
        queue.submit(f"heavy-{i % 2}", f"h{i}")
    queue.submit("light", "l")
    for _ in range(7):
        picked = queue.start_next()
        if picked is None:
            break
        execution_id, item = picked
        order.append(item)
        queue.done(execution_id, 0.001 if execution_id == "light" else 0.3)
    assert order.index("l") <= 2, order  # after at most the two already at the clock


def test_idling_earns_no_credit() -> None:
    queue: FairQueue[str] = FairQueue(workers=1)
    for i in range(3):  # busy's jobs hold the worker 1 s each: the clock reaches 2
        queue.submit("busy", f"b{i}")
        assert queue.start_next() == ("busy", f"b{i}")
        queue.done("busy", 1.0)
    queue.submit("busy", "b3")
    queue.submit("late", "l0")  # starts at the clock (2), not at 0
    queue.submit("late", "l1")
    order = []
    while (picked := queue.start_next()) is not None:
        order.append(picked[1])
        queue.done(picked[0], 1.0)
    # From 0, late would run both of its jobs before busy's next.
    assert order == ["l0", "b3", "l1"]


def test_a_forgotten_execution_keeps_its_queued_jobs() -> None:
    queue: FairQueue[str] = FairQueue(workers=1)
    queue.submit("gone", "g")
    queue.forget("gone")
    assert queue.start_next() == ("gone", "g")
    queue.forget("gone")
    queue.done("gone", 0.2)  # no account left: nothing to charge, no error
    assert queue.busy == 0 and queue.waiting == 0


@pytest.mark.parametrize(
    ("refusals", "cpu_s", "max_s", "wait_s"),
    [
        (0, 0.02, 1.0, 0.0),  # accepted: no wait
        (1, 0.02, 1.0, 0.04),
        (2, 0.02, 1.0, 0.08),
        (4, 0.02, 1.0, 0.32),
        (9, 0.02, 1.0, 0.32),  # 16x at most
        (4, 0.2, 1.0, 1.0),  # capped
        (3, 0.02, 0.0, 0.0),  # turned off
        (1, 0.0001, 1.0, 0.0002),  # a harness's cheap bad request: a fraction of a millisecond
    ],
)
def test_a_refused_executions_wait_grows_with_what_its_refusals_cost(
    refusals: int, cpu_s: float, max_s: float, wait_s: float
) -> None:
    assert refusal_wait_s(refusals, cpu_s, max_s=max_s) == pytest.approx(wait_s)


async def test_a_refused_execution_waits_before_its_next_request_and_an_accepted_one_clears_it() -> None:
    workers = RenderWorkers(per_execution=1, refusal_wait_max_s=1.0)

    def burn() -> int:  # some worker CPU for the refusal to be charged
        return sum(range(300_000))

    try:
        with pytest.raises(InvalidArgument):
            async with workers.slot("flooder", accepts=True):
                await workers.run("flooder", burn)
                refused_at = time.monotonic()
                raise InvalidArgument("tools[0].description", "over the context window")
        with pytest.raises(Unavailable):  # the proxy's own failure: not the sender's to repay
            async with workers.slot("unlucky", accepts=True):
                await workers.run("unlucky", burn)
                raise Unavailable("no engine is serving")
        flooder, unlucky = workers._standing["flooder"], workers._standing["unlucky"]
        assert flooder.refusals == 1 and flooder.wait_until > refused_at  # a wait, from then on
        assert unlucky.refusals == 0 and unlucky.wait_until == 0.0
        async with workers.slot("flooder"):  # read and parsed, not yet accepted: still counted
            await workers.run("flooder", burn)
        assert flooder.refusals == 1
        async with workers.slot("flooder", accepts=True):  # waits its turn, then is accepted
            await workers.run("flooder", burn)
        assert (flooder.refusals, flooder.wait_until, flooder.cpu_s) == (0, 0.0, 0.0)
    finally:
        workers.shutdown()
