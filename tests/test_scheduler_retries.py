"""The replacement rule for infrastructure failures, and the allowance a task carries (pure)."""

from __future__ import annotations

import pytest

from gyre.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler.codec import spec_from_proto, spec_to_proto
from services.scheduler.retries import decide_replacement
from services.scheduler.tasks import DEFAULT_INFRA_RETRIES


@pytest.mark.parametrize("state", ["admitted", "running", "done"])
def test_an_open_group_with_allowance_left_gets_a_replacement(state: str) -> None:
    decision = decide_replacement(task_state=state, max_infra_retries=2, num_replacements=1, limit_s=60.0)
    assert decision.replace and decision.reason == ""


@pytest.mark.parametrize(
    ("state", "allowance", "used", "limit_s", "why"),
    [
        ("running", 2, 2, 60.0, "allowance spent (2 of 2 retries used)"),
        ("running", 0, 0, 60.0, "allowance spent (0 of 0 retries used)"),
        ("trained", 0, 0, 60.0, "allowance spent (0 of 0 retries used)"),
        ("cancelled", 2, 0, 60.0, "the task is cancelled"),
        ("graded", 2, 0, 60.0, "the task is graded: its group no longer rolls out"),
        ("set_aside", 2, 0, 60.0, "the task is set_aside: its group no longer rolls out"),
        ("running", 2, 0, 0.0, "the task's deadline has passed"),
    ],
)
def test_no_replacement_says_why(state: str, allowance: int, used: int, limit_s: float, why: str) -> None:
    decision = decide_replacement(
        task_state=state, max_infra_retries=allowance, num_replacements=used, limit_s=limit_s
    )
    assert (decision.replace, decision.reason) == (False, why)


def test_an_unset_allowance_is_the_default_and_is_stored_as_used() -> None:
    unset = pb.TaskSpec(
        name="t", family="terminal", prompt="p", group_size=2, timeout_s=60, harness="gyre-agent"
    )
    spec = spec_from_proto(unset)
    assert spec.max_infra_retries == DEFAULT_INFRA_RETRIES
    stored = spec_to_proto(spec)  # what TaskSubmitted carries
    assert stored.HasField("max_infra_retries") and stored.max_infra_retries == DEFAULT_INFRA_RETRIES
    unset.max_infra_retries = 0  # an explicit 0 is no retries, not the default
    assert spec_from_proto(unset).max_infra_retries == 0
