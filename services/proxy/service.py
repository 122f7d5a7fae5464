"""ProxyService gRPC methods (shell: validate -> act on the routing table / token book -> persist)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TypeVar

import structlog
from google.protobuf.message import Message
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.db.outbox import OutboxRelay, enqueue
from gyre.errors import Conflict, InvalidArgument
from gyre.events import new_event
from gyre.ids import require_uuid, validate_request_id
from gyre.proxy.v1 import events_pb2, proxy_pb2, proxy_pb2_grpc
from gyre.rpc import Context
from services.proxy import repo
from services.proxy.auth import TokenBook, token_digest
from services.proxy.calls import Calls
from services.proxy.drain import drain_cell
from services.proxy.peers import PeerLink, combine
from services.proxy.routing import Route

log = structlog.get_logger(__name__)
PRODUCER = "proxy"
M = TypeVar("M", bound=Message)
_CELL_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
MAX_POLICY_VERSION = 2**63 - 1
"""Postgres stores versions as bigint."""
_ADDRESS = re.compile(r"^[A-Za-z0-9_.\[\]:-]+:\d{1,5}$")
ROUTE_STATE = {
    "active": proxy_pb2.ROUTE_STATE_ACTIVE,
    "draining": proxy_pb2.ROUTE_STATE_DRAINING,
    "drained": proxy_pb2.ROUTE_STATE_DRAINED,
}


def _require_name(field: str, value: str) -> None:
    if not _CELL_ID.match(value):
        raise InvalidArgument(field, f"must be 1..128 characters of [A-Za-z0-9_.:-], got {value!r}")


class ProxyServicer(proxy_pb2_grpc.ProxyServiceServicer):
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        relay: OutboxRelay,
        *,
        calls: Calls,
        tokens: TokenBook,
        link: PeerLink | None = None,
    ) -> None:
        self.sessions = sessions
        self.relay = relay
        self.calls = calls
        self.tokens = tokens
        self.link = link
        """The other proxy processes, when several serve (`peers`): what changes every process's
        state goes to them too."""

    async def _idempotent(
        self,
        method: str,
        request: Message,
        answer_cls: type[M],
        act: Callable[[AsyncSession], Awaitable[tuple[M, list[Message]]]],
    ) -> M:
        """Run `act` once per request id; its answer and events commit with the claim."""
        request_id: str = getattr(request, "request_id")  # noqa: B009

        async def run(session: AsyncSession) -> M:
            answer, payloads = await act(session)
            events = [
                new_event(p, producer=PRODUCER, correlation_id=request_id, causation_id=request_id)
                for p in payloads
            ]
            await enqueue(session, repo.outbox, *events)
            return answer

        answer, fresh = await repo.requests.answer_once(
            self.sessions, method=method, request=request, cls=answer_cls, act=run
        )
        if fresh:
            self.relay.poke()
        return answer

    async def RegisterExecutionToken(
        self, request: proxy_pb2.RegisterExecutionTokenRequest, context: Context
    ) -> proxy_pb2.RegisterExecutionTokenResponse:
        validate_request_id(request.request_id)
        if not (32 <= len(request.token) <= 256 and request.token.isascii() and request.token.isprintable()):
            raise InvalidArgument("token", "must be 32..256 printable ASCII characters")
        require_uuid("execution.execution_id", request.execution.execution_id, what="an execution")
        if not request.HasField("expires_at"):
            raise InvalidArgument("expires_at", "is required (the execution's deadline plus a grace period)")
        expires_at = request.expires_at.ToDatetime(tzinfo=UTC)
        if request.min_policy_version.steps > MAX_POLICY_VERSION:
            raise InvalidArgument(
                "min_policy_version.steps",
                f"must be at most {MAX_POLICY_VERSION} (a count of optimizer steps), "
                f"got {request.min_policy_version.steps}",
            )

        async def act(
            session: AsyncSession,
        ) -> tuple[proxy_pb2.RegisterExecutionTokenResponse, list[Message]]:
            execution_id = await repo.upsert_token(
                session,
                token_sha256=token_digest(request.token),
                execution_id=request.execution.execution_id,
                task_id=request.execution.task_id,
                expires_at=expires_at,
                min_policy_version=request.min_policy_version.steps,
            )
            if execution_id != request.execution.execution_id:
                raise Conflict("token is already registered for another execution")
            answer = proxy_pb2.RegisterExecutionTokenResponse(execution_id=execution_id)
            answer.expires_at.FromDatetime(expires_at)
            return answer, []

        return await self._idempotent(
            "RegisterExecutionToken", request, proxy_pb2.RegisterExecutionTokenResponse, act
        )

    async def RevokeExecutionToken(
        self, request: proxy_pb2.RevokeExecutionTokenRequest, context: Context
    ) -> proxy_pb2.RevokeExecutionTokenResponse:
        validate_request_id(request.request_id)
        require_uuid("execution_id", request.execution_id, what="an execution")
        # Stop the execution's calls here first: the count below must be final, so no call may
        # start after it and every running one must have a durable record by then.
        self.tokens.forget_execution(request.execution_id)
        owner = self.link.peers.owner_of(request.execution_id) if self.link else 0
        if self.link and owner != self.link.peers.index:
            cancelled = await self.link.close_execution(
                owner, request.execution_id, cancel_in_flight=request.cancel_in_flight
            )
        else:
            cancelled = await self.calls.close(
                request.execution_id, cancel_in_flight=request.cancel_in_flight
            )

        async def act(session: AsyncSession) -> tuple[proxy_pb2.RevokeExecutionTokenResponse, list[Message]]:
            revoked = await repo.revoke_tokens(session, request.execution_id, now=datetime.now(UTC))
            await repo.forget_outputs(session, request.execution_id)
            recorded = await repo.recorded_call_count(session, request.execution_id)
            failed, last_failure = await repo.failed_call_count(session, request.execution_id)
            answer = proxy_pb2.RevokeExecutionTokenResponse(
                num_tokens_revoked=revoked,
                num_calls_cancelled=cancelled,
                num_calls_recorded=recorded,
                num_calls_failed_by_proxy=failed,
                last_call_failure=last_failure,
            )
            return answer, []

        answer = await self._idempotent(
            "RevokeExecutionToken", request, proxy_pb2.RevokeExecutionTokenResponse, act
        )
        log.info(
            "execution_token_revoked",
            execution_id=request.execution_id,
            cancelled=cancelled,
            recorded=answer.num_calls_recorded,
            failed_by_proxy=answer.num_calls_failed_by_proxy,
        )
        return answer

    async def RegisterEngine(
        self, request: proxy_pb2.RegisterEngineRequest, context: Context
    ) -> proxy_pb2.RegisterEngineResponse:
        validate_request_id(request.request_id)
        _require_name("cell_id", request.cell_id)
        _require_name("engine_id", request.engine_id)
        if not _ADDRESS.match(request.address):
            raise InvalidArgument("address", f"must be host:port, got {request.address!r}")
        route = Route(cell_id=request.cell_id, engine_id=request.engine_id, address=request.address)

        async def act(session: AsyncSession) -> tuple[proxy_pb2.RegisterEngineResponse, list[Message]]:
            await repo.save_route(session, route)
            return proxy_pb2.RegisterEngineResponse(route=self._route_proto(route)), []

        answer = await self._idempotent("RegisterEngine", request, proxy_pb2.RegisterEngineResponse, act)
        self.calls.router.register(route)
        if self.link:
            await self.link.register(route)
        log.info("engine_registered", cell_id=route.cell_id, engine_id=route.engine_id, address=route.address)
        return answer

    async def DrainCell(
        self, request: proxy_pb2.DrainCellRequest, context: Context
    ) -> proxy_pb2.DrainCellResponse:
        validate_request_id(request.request_id)
        _require_name("cell_id", request.cell_id)
        if not request.timeout_s > 0:
            raise InvalidArgument("timeout_s", f"must be > 0 seconds, got {request.timeout_s}")
        if not any(r.cell_id == request.cell_id for r in self.calls.router.routes.values()):
            raise InvalidArgument("cell_id", f"no engine of cell {request.cell_id!r} is registered")
        first = await repo.requests.answered(
            self.sessions, method="DrainCell", request=request, cls=proxy_pb2.DrainCellResponse
        )
        if first is not None:  # answered before: do not drain again (the cell may serve again since)
            return first
        targets = tuple(request.target_cell_ids)
        local = drain_cell(
            self.calls, cell_id=request.cell_id, target_cells=targets, timeout_s=request.timeout_s
        )
        if self.link:  # every process moves the calls it serves
            here, there = await asyncio.gather(
                local,
                self.link.drain(cell_id=request.cell_id, target_cells=targets, timeout_s=request.timeout_s),
            )
            result = combine([here, *there])
        else:
            result = await local
        answer = proxy_pb2.DrainCellResponse(
            drained=result.drained,
            num_calls_migrated=result.num_migrated,
            num_calls_recomputed=result.num_recomputed,
            num_calls_remaining=result.num_remaining,
            kv_transferred_bytes=result.kv_bytes,
            duration_s=result.duration_s,
        )
        drained = events_pb2.CellDrained(
            cell_id=request.cell_id,
            request_id=request.request_id,
            num_calls_migrated=result.num_migrated,
            num_calls_recomputed=result.num_recomputed,
            kv_transferred_bytes=result.kv_bytes,
            duration_s=result.duration_s,
        )
        routes = [r for r in self.calls.router.routes.values() if r.cell_id == request.cell_id]

        async def act(session: AsyncSession) -> tuple[proxy_pb2.DrainCellResponse, list[Message]]:
            for route in routes:
                await repo.save_route(session, route)
            return answer, [drained] if result.drained else []

        log.info(
            "cell_drained", cell_id=request.cell_id, drained=result.drained, migrated=result.num_migrated
        )
        return await self._idempotent("DrainCell", request, proxy_pb2.DrainCellResponse, act)

    async def GetRouting(
        self, request: proxy_pb2.GetRoutingRequest, context: Context
    ) -> proxy_pb2.GetRoutingResponse:
        loads = sorted(self.calls.router.loads(), key=lambda load: (load.route.cell_id, load.route.engine_id))
        elsewhere = await self.link.loads() if self.link else {}
        routes = []
        for load in loads:
            route = self._route_proto(load.route)
            route.num_in_flight_calls = load.num_in_flight + elsewhere.get(load.route.engine_id, 0)
            routes.append(route)
        return proxy_pb2.GetRoutingResponse(routes=routes)

    @staticmethod
    def _route_proto(route: Route) -> proxy_pb2.EngineRoute:
        out = proxy_pb2.EngineRoute(
            cell_id=route.cell_id,
            engine_id=route.engine_id,
            address=route.address,
            state=ROUTE_STATE[route.state],
        )
        out.policy_version.steps = route.policy_version
        return out
