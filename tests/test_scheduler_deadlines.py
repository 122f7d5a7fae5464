"""Task deadlines: a past one is refused naming the task; an admitted execution's limit is cut to it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from gyre.errors import InvalidArgument
from services.scheduler.tasks import TaskSpec, execution_limit_s, validate_deadlines

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SPEC = TaskSpec(name="t", family="arith", prompt="2+2?", group_size=2, timeout_s=600.0, harness="gyre-agent")


def test_a_deadline_in_the_past_is_refused_naming_the_task() -> None:
    with pytest.raises(InvalidArgument) as err:
        validate_deadlines([SPEC, replace(SPEC, deadline=NOW - timedelta(seconds=1))], now=NOW)
    assert err.value.field == "tasks[1].deadline"


def test_a_future_deadline_or_none_passes() -> None:
    validate_deadlines([SPEC, replace(SPEC, deadline=NOW + timedelta(minutes=5))], now=NOW)


@pytest.mark.parametrize(
    ("deadline_in_s", "limit_s"), [(None, 600.0), (120.0, 120.0), (3600.0, 600.0), (-5.0, 0.0)]
)
def test_an_executions_limit_is_its_timeout_cut_to_the_deadline(
    deadline_in_s: float | None, limit_s: float
) -> None:
    deadline = None if deadline_in_s is None else NOW + timedelta(seconds=deadline_in_s)
    assert execution_limit_s(replace(SPEC, deadline=deadline), now=NOW) == limit_s
