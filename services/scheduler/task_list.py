"""ListTasks: one page of tasks, oldest first, optionally in one state (shell: validate -> tables).

Pages are keyset pages over the tasks' submission order (`tasks.seq`), not offsets: a task
submitted or advanced while a client pages does not shift the pages it has not read yet. The
page token is opaque to clients; it carries the last task's place and the state filter it was
made for, so a token reused with another filter is refused rather than silently misread.

Example:
    ListTasks(state=PENDING, page_size=2)                -> [t1, t3], next_page_token "v1.7.1"
    ListTasks(state=PENDING, page_size=2, token "v1.7.1") -> [t4], next_page_token ""
"""

from __future__ import annotations

import uuid
from collections import defaultdict

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.errors import InvalidArgument
from gyre.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler import repo
from services.scheduler.codec import task_to_proto

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
TOKEN_VERSION = "v1"


def make_page_token(*, after_seq: int, state: int) -> str:
    return f"{TOKEN_VERSION}.{after_seq}.{state}"


def read_page_token(token: str, *, state: int) -> int | None:
    """The submission place a page starts after (None: the first page); InvalidArgument when
    the token is not one this scheduler returned, or was made for another state filter."""
    if not token:
        return None
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_VERSION or not all(p.isdigit() for p in parts[1:]):
        raise InvalidArgument(
            "page_token", "is not a token this scheduler returned: pass a previous next_page_token"
        )
    after_seq, token_state = int(parts[1]), int(parts[2])
    if token_state != state:
        made_for = state_name(token_state) if token_state in pb.TaskState.values() else str(token_state)
        raise InvalidArgument(
            "page_token",
            f"was made for {'every state' if token_state == 0 else 'state ' + made_for}: "
            "repeat that state filter with it",
        )
    return after_seq


def state_name(state: int) -> str:
    """The stored name of a TaskState value (`TASK_STATE_PENDING` -> `pending`)."""
    return pb.TaskState.Name(state).removeprefix("TASK_STATE_").lower()  # type: ignore[arg-type]


def validate(request: pb.ListTasksRequest) -> tuple[int, int | None]:
    """(page size, the place the page starts after) or InvalidArgument naming the field."""
    if request.state not in pb.TaskState.values():
        known = ", ".join(n.removeprefix("TASK_STATE_").lower() for n in pb.TaskState.keys()[1:])
        raise InvalidArgument("state", f"unknown task state {request.state}; known: {known}")
    if request.page_size > MAX_PAGE_SIZE:
        raise InvalidArgument("page_size", f"must be at most {MAX_PAGE_SIZE}, got {request.page_size}")
    return request.page_size or DEFAULT_PAGE_SIZE, read_page_token(request.page_token, state=request.state)


async def list_tasks(
    sessions: async_sessionmaker[AsyncSession], request: pb.ListTasksRequest
) -> pb.ListTasksResponse:
    page_size, after = validate(request)
    t, e = repo.tasks.c, repo.executions.c
    # One row past the page says whether another page follows.
    stmt = sa.select(repo.tasks).order_by(t.seq).limit(page_size + 1)
    if request.state:
        stmt = stmt.where(t.state == state_name(request.state))
    if after is not None:
        stmt = stmt.where(t.seq > after)
    async with sessions() as session:
        rows = (await session.execute(stmt)).all()
        page = rows[:page_size]
        group: defaultdict[uuid.UUID, list[tuple[str, int]]] = defaultdict(list)
        if page:
            members = await session.execute(
                sa.select(e.task_id, e.execution_id, e.index_in_group)
                .where(e.task_id.in_([r.task_id for r in page]))
                .order_by(e.task_id, e.index_in_group)
            )
            for m in members:
                group[m.task_id].append((str(m.execution_id), m.index_in_group))
    out = pb.ListTasksResponse()
    for row in page:
        state = pb.TaskState.Value(f"TASK_STATE_{row.state.upper()}")
        out.tasks.append(task_to_proto(repo.planned_task(row, group[row.task_id]), state=state))
    if len(rows) > page_size:
        out.next_page_token = make_page_token(after_seq=page[-1].seq, state=request.state)
    return out
