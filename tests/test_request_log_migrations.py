"""The runner's and the evaluator's request tables move onto the kernel's request log, answers kept."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import asyncpg
import pytest
import pytest_asyncio

from gyre.db.engine import libpq_url, make_engine, make_sessionmaker, with_database
from gyre.db.requests import request_fingerprint
from gyre.evaluator.v1 import evaluator_pb2
from gyre.runner.v1 import runner_pb2
from gyre_app.migrations import upgrade
from services.evaluator import repo as evaluator_repo
from services.runner import repo as runner_repo

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(loop_scope="session")
async def fresh_url(server_urls: tuple[str, str]) -> AsyncIterator[str]:
    """A database of this test's own, at no revision yet."""
    name = f"gyre_migr_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(libpq_url(server_urls[1]))
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(server_urls[1], name)
    admin = await asyncpg.connect(libpq_url(server_urls[1]))
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_old_answers_are_found_by_the_request_log_after_the_migrations(fresh_url: str) -> None:
    for service in ("runner", "evaluator"):
        await asyncio.to_thread(upgrade, service, fresh_url, "0001")
    start = runner_pb2.StartExecutionRequest(request_id="start-1", harness="gyre-agent", prompt="p")
    execution_id = str(uuid.uuid4())
    grade = evaluator_pb2.GradeWorkspaceRequest(request_id="grade-1", family="terminal", task="t")
    graded = evaluator_pb2.GradeWorkspaceResponse(
        grade=evaluator_pb2.Grade(execution_id=execution_id, score=0.5), reward_published=True
    )
    pg = await asyncpg.connect(libpq_url(fresh_url))
    try:
        await pg.execute(
            "INSERT INTO runner.rpc_requests (request_id, method, fingerprint, execution_id) "
            "VALUES ($1, $2, $3, $4)",
            "start-1",
            "StartExecution",
            request_fingerprint(start),
            uuid.UUID(execution_id),
        )
        await pg.execute(
            "INSERT INTO evaluator.rpc_requests (request_id, fingerprint, response) VALUES ($1, $2, $3)",
            "grade-1",
            request_fingerprint(grade),
            graded.SerializeToString(),
        )
    finally:
        await pg.close()
    for service in ("runner", "evaluator"):
        await asyncio.to_thread(upgrade, service, fresh_url)
    engine = make_engine(fresh_url)
    sessions = make_sessionmaker(engine)
    try:
        runner_answer = await runner_repo.requests.answered(
            sessions, method="StartExecution", request=start, cls=runner_pb2.StartExecutionResponse
        )
        evaluator_answer = await evaluator_repo.requests.answered(
            sessions, method="GradeWorkspace", request=grade, cls=evaluator_pb2.GradeWorkspaceResponse
        )
    finally:
        await engine.dispose()
    assert runner_answer is not None and runner_answer.execution.execution.execution_id == execution_id
    assert evaluator_answer == graded
