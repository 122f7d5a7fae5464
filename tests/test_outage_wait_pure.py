"""The consumer's outage decisions (pure): a failure while a dependency is away is waited out and
never counted, a lost connection that answers again is retried once in place, and an outage
that reaches `settle` (the consumer stopping mid-wait) is retried, never dead-lettered."""

from __future__ import annotations

import asyncpg
import nats.errors
import nats.js.errors
import pytest
import sqlalchemy.exc

from gyre.outages import failure_fate
from gyre.settle import Fate, Hold, Limits, Outcome, after_failure, probe_delay_s, settle

LIMITS = Limits(max_deliver=5, max_wait_deliver=0, retry_base_s=1.0)


@pytest.mark.parametrize("outage_error", [True, False])
@pytest.mark.parametrize("retried_in_place", [0, 1, 7])
def test_a_failure_while_a_dependency_is_away_is_always_waited_out(
    outage_error: bool, retried_in_place: int
) -> None:
    hold = after_failure(dependencies_away=True, outage_error=outage_error, retried_in_place=retried_in_place)
    assert hold is Hold.WAIT


def test_a_lost_connection_to_a_dependency_that_answers_again_is_retried_once_in_place() -> None:
    assert after_failure(dependencies_away=False, outage_error=True, retried_in_place=0) is Hold.RETRY
    assert after_failure(dependencies_away=False, outage_error=True, retried_in_place=1) is Hold.SETTLE


def test_a_handler_failure_with_every_dependency_answering_is_settled_and_counted() -> None:
    assert after_failure(dependencies_away=False, outage_error=False, retried_in_place=0) is Hold.SETTLE


@pytest.mark.parametrize("num_delivered", [1, 5, 6, 1000])
def test_an_outage_that_reaches_settle_is_retried_and_never_dead_lettered(num_delivered: int) -> None:
    action = settle(Outcome(Fate.UNAVAILABLE, "postgres away"), num_delivered=num_delivered, limits=LIMITS)
    assert (action.kind, action.label) == ("nak", "unavailable")


def test_a_handler_failure_still_dead_letters_at_its_limit() -> None:
    action = settle(Outcome(Fate.FAILED, "KeyError"), num_delivered=5, limits=LIMITS)
    assert action.kind == "dead_letter"


def test_probes_start_fast_and_settle_at_the_cap() -> None:
    assert [probe_delay_s(n) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert probe_delay_s(10_000, cap_s=2.0) == 2.0


def test_connection_errors_read_as_unavailable_and_others_as_failed() -> None:
    lost = sqlalchemy.exc.OperationalError("SELECT 1", {}, ConnectionRefusedError(111, "refused"))
    assert failure_fate(lost) is Fate.UNAVAILABLE
    assert (
        failure_fate(asyncpg.CannotConnectNowError("the database system is starting up")) is Fate.UNAVAILABLE
    )
    assert failure_fate(KeyError("task")) is Fate.FAILED


def test_a_connection_error_a_few_causes_down_reads_as_an_outage() -> None:
    # As SQLAlchemy's asyncpg adapter raises it while Postgres shuts down (a trainer died of it).
    adapter = RuntimeError("the database system is shutting down")
    adapter.__cause__ = asyncpg.CannotConnectNowError("the database system is shutting down")
    wrapped = sqlalchemy.exc.DBAPIError("SELECT 1", {}, adapter)  # type: ignore[arg-type]
    wrapped.__cause__ = adapter
    assert failure_fate(wrapped) is Fate.UNAVAILABLE
    assert failure_fate(sqlalchemy.exc.DBAPIError("SELECT 1", {}, RuntimeError("syntax"))) is Fate.FAILED  # type: ignore[arg-type]


def test_a_nats_server_going_away_mid_request_reads_as_an_outage() -> None:
    assert failure_fate(nats.js.errors.ServiceUnavailableError()) is Fate.UNAVAILABLE
    assert failure_fate(nats.errors.NoRespondersError()) is Fate.UNAVAILABLE
    assert failure_fate(nats.errors.UnexpectedEOF()) is Fate.UNAVAILABLE
    assert failure_fate(nats.js.errors.NotFoundError()) is Fate.FAILED  # a stream deleted is no outage
