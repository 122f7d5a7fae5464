"""`gyre replay`: the trajectory service's projections rebuilt from its call log into a scratch
schema and diffed against the live ones, on a real Postgres database of the test's own."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from trainer_stack import fresh_kernel

from gyre.db.engine import libpq_url, make_engine, make_sessionmaker
from gyre_app.migrations import upgrade
from services.trajectory.call_log import CallLog
from services.trajectory.synthetic import SyntheticConfig, generate_execution

pytestmark = pytest.mark.asyncio(loop_scope="session")
REPO = Path(__file__).resolve().parents[1]
SMALL = {
    "target_tokens": 1500,
    "system_prompt_tokens": 40,
    "task_tokens": 20,
    "output_tokens_mean": 20.0,
    "observation_tokens_mean": 40.0,
    "compaction_context_tokens": 600,
    "summary_tokens": 30,
    "sub_agent_probability": 0.2,
}


@dataclass
class Log:
    url: str
    env: dict[str, str]
    first: list[str]
    """Executions ingested in the first transaction."""
    second: list[str]
    between: datetime
    num_first_calls: int
    num_calls: int

    async def gyre(self, *args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gyre_app.cli", "replay", *args,
            cwd=REPO, env=self.env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    async def replay_json(self, *args: str) -> tuple[int, Any, str]:
        rc, out, err = await self.gyre(*args, "--json")
        return rc, json.loads(out.strip().splitlines()[-1]) if out.strip() else None, err


async def ingest(url: str, seeds: range) -> tuple[list[str], int]:
    executions = [str(uuid.uuid4()) for _ in seeds]
    records = [
        r
        for e, seed in zip(executions, seeds, strict=True)
        for r in generate_execution(e, config=SyntheticConfig(seed=seed, **SMALL))  # type: ignore[arg-type]
    ]
    engine = make_engine(url)
    try:
        async with make_sessionmaker(engine)() as session, session.begin():
            result = await CallLog().ingest(session, records)
        assert not result.rejected and result.stored == len(records)
    finally:
        await engine.dispose()
    return executions, len(records)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def log(server_urls: tuple[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Log]:
    async with fresh_kernel(*server_urls) as kernel:
        assert kernel.database_url is not None
        url = kernel.database_url
        await asyncio.to_thread(upgrade, "trajectory", url)
        first, n_first = await ingest(url, range(1, 4))
        await asyncio.sleep(0.05)
        between = datetime.now(UTC)
        await asyncio.sleep(0.05)
        second, n_second = await ingest(url, range(4, 6))
        env = {
            **os.environ,
            "GYRE_DATABASE_URL": url,
            "GYRE_STATE_DIR": str(tmp_path_factory.mktemp("no-stack")),
        }
        yield Log(
            url=url,
            env=env,
            first=first,
            second=second,
            between=between,
            num_first_calls=n_first,
            num_calls=n_first + n_second,
        )


async def test_the_whole_log_rebuilds_the_live_projections(log: Log) -> None:
    rc, report, err = await log.replay_json()
    assert rc == 0, err
    assert (report["num_executions"], report["num_calls"], report["same"]) == (5, log.num_calls, True)
    assert {d["table"]: d["num_live"] == d["num_replayed"] > 0 for d in report["diffs"]} == {
        "executions": True,
        "trajectories": True,
        "tree_calls": True,
    }


async def test_a_time_selects_the_executions_written_since(log: Log) -> None:
    rc, report, err = await log.replay_json("--since", log.between.isoformat())
    assert rc == 0, err
    assert report["num_executions"] == 2 and report["num_calls"] == log.num_calls - log.num_first_calls


async def test_a_position_selects_the_executions_from_there_on(log: Log) -> None:
    rc, report, err = await log.replay_json("--from-position", str(log.num_first_calls))
    assert rc == 0, err
    assert report["num_executions"] == 2


async def test_a_corrupted_projection_row_is_reported(log: Log) -> None:
    execution = log.second[0]
    pg = await asyncpg.connect(libpq_url(log.url))
    try:
        await pg.execute(
            "UPDATE trajectory.trajectories SET num_calls = num_calls + 7 "
            "WHERE execution_id = $1 AND chain_index = 0",
            execution,
        )
        rc, report, err = await log.replay_json("--execution", execution)
    finally:
        await pg.execute(
            "UPDATE trajectory.trajectories SET num_calls = num_calls - 7 "
            "WHERE execution_id = $1 AND chain_index = 0",
            execution,
        )
        await pg.close()
    assert rc == 1 and err.strip().splitlines() == [
        "gyre replay: the live trajectories projection(s) differ from what the trajectory log rebuilds"
    ]
    [diff] = [d for d in report["diffs"] if not (d["only_live"] == d["only_replayed"] == [])]
    assert diff["table"] == "trajectories"
    assert diff["only_live"][0]["num_calls"] == diff["only_replayed"][0]["num_calls"] + 7


async def test_a_position_past_the_end_is_refused(log: Log) -> None:
    rc, out, err = await log.gyre("--from-position", "1000000")
    assert rc == 1 and out == ""
    assert err.strip() == (
        f"gyre replay: position 1000000 is past the end of the call log "
        f"({log.num_calls} calls, positions 0..{log.num_calls - 1})"
    )


async def test_a_time_after_the_last_call_is_refused(log: Log) -> None:
    rc, _, err = await log.gyre("--since", "2099-01-01T00:00:00")
    assert rc == 1 and err.startswith("gyre replay: no call recorded since 2099-01-01T00:00:00+00:00")


async def test_an_execution_without_calls_is_refused(log: Log) -> None:
    missing = str(uuid.uuid4())
    rc, _, err = await log.gyre("--execution", missing)
    assert (rc, err.strip()) == (1, f"gyre replay: no call recorded for execution {missing}")
