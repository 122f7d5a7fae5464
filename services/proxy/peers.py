"""Several proxy processes behind one address: forwarding a call to its execution's owner, and
the control requests one process fans out to the others (shell: aiohttp).

Layout (`ProxySettings.processes` = N > 1): process 0 serves the gRPC ProxyService and starts
processes 1..N-1 (`proxy_processes`); all N accept the harnesses' HTTP connections on one port
(SO_REUSEPORT), and each also listens on a private port of its own. A model call is served by
the execution's owner (`pinning.owner`): the process a connection landed on authenticates the
call, and when the execution is another's it forwards the request's bytes to the owner's
private port and streams the answer back unchanged (`pin_middleware`). What the gRPC service
changes in every process's state goes to each peer by an internal request on its private
port, with the peers' secret: a route registered, a cell drained (each process moves its own
calls; the answer sums them), an execution closed (by its owner), the engines' loads.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Collection
from dataclasses import asdict
from typing import Any

import aiohttp
import structlog
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from gyre.errors import Unavailable
from services.proxy.auth import TokenBook, Unauthenticated, bearer_token
from services.proxy.calls import Calls
from services.proxy.drain import DrainResult, drain_cell
from services.proxy.pinning import PEER_HEADER, Peers
from services.proxy.routing import Route

log = structlog.get_logger(__name__)
PINNED_PATHS = frozenset({"/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"})
_HOP_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "keep-alive"})
CONTROL = "/internal/peer"
PROCESS_HEADER = "x-gyre-proxy-process"
"""On every answer: the index of the process that served it (a forwarded call's is its owner's)."""


class PeerLink:
    """This process's client side: forwarding and control requests to the other processes."""

    def __init__(self, peers: Peers, tokens: TokenBook) -> None:
        self.peers = peers
        self.tokens = tokens
        self._http: aiohttp.ClientSession | None = None
        self.forwarded = 0

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:  # made inside the event loop that uses it
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=None)
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    def is_peer(self, request: web.Request) -> bool:
        return hmac.compare_digest(request.headers.get(PEER_HEADER, ""), self.peers.secret)

    # -- forwarding -----------------------------------------------------------------------------

    async def owner_of(self, request: web.Request) -> int:
        """The owner of the call's execution; this process when the token is not valid (it
        answers the 401 itself, in the dialect the harness spoke)."""
        token = bearer_token(request.headers.get("Authorization", ""), request.headers.get("x-api-key", ""))
        try:
            grant = await self.tokens.grant_of(token)
        except Unauthenticated:
            return self.peers.index
        return self.peers.owner_of(grant.execution_id)

    async def forward(self, request: web.Request, owner: int) -> web.StreamResponse:
        """The request, sent whole to `owner`'s private port; its answer streamed back as is."""
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        headers[PEER_HEADER] = self.peers.secret
        url = self.peers.urls[owner] + request.path_qs
        self.forwarded += 1
        try:
            async with self.http().request(request.method, url, data=body, headers=headers) as answer:
                response = web.StreamResponse(status=answer.status)
                for name in ("Content-Type", "Cache-Control", PROCESS_HEADER):
                    if name in answer.headers:
                        response.headers[name] = answer.headers[name]
                await response.prepare(request)
                async for chunk in answer.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response
        except aiohttp.ClientError as exc:  # the owner is away: a failure of the proxy's own
            raise Unavailable(f"proxy process {owner}, which serves this execution, is unreachable") from exc

    # -- control --------------------------------------------------------------------------------

    async def _post(self, index: int, action: str, payload: dict[str, Any]) -> Any:
        url = f"{self.peers.urls[index]}{CONTROL}/{action}"
        async with self.http().post(url, json=payload, headers={PEER_HEADER: self.peers.secret}) as answer:
            if answer.status != 200:
                raise Unavailable(f"proxy process {index} refused {action}: HTTP {answer.status}")
            return await answer.json()

    async def _all_others(self, action: str, payload: dict[str, Any]) -> list[Any]:
        return await asyncio.gather(*(self._post(i, action, payload) for i in self.peers.others()))

    async def register(self, route: Route) -> None:
        await self._all_others("register", asdict(route))

    async def drain(
        self, *, cell_id: str, target_cells: Collection[str], timeout_s: float
    ) -> list[DrainResult]:
        payload = {"cell_id": cell_id, "target_cells": list(target_cells), "timeout_s": timeout_s}
        return [DrainResult(**r) for r in await self._all_others("drain", payload)]

    async def close_execution(self, owner: int, execution_id: str, *, cancel_in_flight: bool) -> int:
        answer = await self._post(
            owner, "close", {"execution_id": execution_id, "cancel_in_flight": cancel_in_flight}
        )
        return int(answer["cancelled"])

    async def loads(self) -> dict[str, int]:
        """Calls in flight per engine in the other processes."""
        total: dict[str, int] = {}
        for answer in await self._all_others("loads", {}):
            for engine_id, n in answer.items():
                total[engine_id] = total.get(engine_id, 0) + int(n)
        return total


def combine(results: list[DrainResult]) -> DrainResult:
    """One answer for a cell drained in every process: drained only if drained in all."""
    return DrainResult(
        drained=all(r.drained for r in results),
        num_migrated=sum(r.num_migrated for r in results),
        num_recomputed=sum(r.num_recomputed for r in results),
        num_remaining=sum(r.num_remaining for r in results),
        kv_bytes=sum(r.kv_bytes for r in results),
        duration_s=max(r.duration_s for r in results),
    )


def pin_middleware(link: PeerLink) -> Middleware:
    @web.middleware
    async def pin(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(CONTROL):
            if not link.is_peer(request):
                raise web.HTTPNotFound()
            return await handler(request)
        if request.method != "POST" or request.path not in PINNED_PATHS or link.is_peer(request):
            return await handler(request)
        owner = await link.owner_of(request)
        if owner == link.peers.index:
            return await handler(request)
        return await link.forward(request, owner)

    return pin


def add_control_routes(app: web.Application, *, link: PeerLink, calls: Calls) -> None:
    """The internal requests a peer answers (only with the peers' secret: `pin_middleware`), and
    the header naming the process that answered."""
    tokens = link.tokens

    async def register(request: web.Request) -> web.Response:
        calls.router.register(Route(**await request.json()))
        return web.json_response({})

    async def drain(request: web.Request) -> web.Response:
        body = await request.json()
        result = await drain_cell(
            calls,
            cell_id=body["cell_id"],
            target_cells=tuple(body["target_cells"]),
            timeout_s=body["timeout_s"],
        )
        return web.json_response(asdict(result))

    async def close(request: web.Request) -> web.Response:
        body = await request.json()
        tokens.forget_execution(body["execution_id"])
        cancelled = await calls.close(body["execution_id"], cancel_in_flight=body["cancel_in_flight"])
        return web.json_response({"cancelled": cancelled})

    async def loads(request: web.Request) -> web.Response:
        return web.json_response({load.route.engine_id: load.num_in_flight for load in calls.router.loads()})

    async def mark(request: web.Request, response: web.StreamResponse) -> None:
        response.headers.setdefault(PROCESS_HEADER, str(index))

    index = str(link.peers.index)
    app.on_response_prepare.append(mark)
    app.router.add_post(f"{CONTROL}/register", register)
    app.router.add_post(f"{CONTROL}/drain", drain)
    app.router.add_post(f"{CONTROL}/close", close)
    app.router.add_post(f"{CONTROL}/loads", loads)
