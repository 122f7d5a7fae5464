"""The reduced fault suite: services killed mid-run and duplicated or reordered events lose no
call and train no group twice (real processes, real NATS and Postgres; see bench/faults.py)."""

from __future__ import annotations

import json

import pytest

from bench.faults import run

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.slow, pytest.mark.e2e]


async def test_the_reduced_fault_set_loses_nothing_and_trains_nothing_twice(
    server_urls: tuple[str, str],
) -> None:
    figures = await run(full=False, urls=server_urls)
    assert figures["scenarios"] == 5
    problems = {
        k: figures[k] for k in ("lost_calls", "duplicate_calls", "duplicate_trained_groups", "unrecovered")
    }
    # the message whole (pytest shortens a list's repr): which scenario, and its recovery time
    assert problems == {k: 0 for k in problems}, json.dumps(figures["by_scenario"])
