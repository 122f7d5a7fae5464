"""Proxy process wiring: gRPC ProxyService, the HTTP APIs, the recorder and the outbox relay (shell)."""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass
from pathlib import Path

import structlog
from aiohttp import web

from gyre.db.outbox import OutboxRelay
from gyre.errors import GyreError
from gyre.proxy.v1 import proxy_pb2, proxy_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.runtime import ServiceHost, connect
from gyre.settings import KernelSettings
from services.proxy import metrics, repo
from services.proxy.auth import TokenBook
from services.proxy.call_keys import CallKey, StoredAnswer, answer_from_json
from services.proxy.calls import Calls
from services.proxy.config import ProxySettings
from services.proxy.failed_calls import FailedCalls
from services.proxy.generation import EnginePool
from services.proxy.http_app import build_app
from services.proxy.model import ServedModel, load_model
from services.proxy.peers import PeerLink, add_control_routes, pin_middleware
from services.proxy.pinning import Peers
from services.proxy.processes import Children, plan_peers, shared_socket
from services.proxy.recorder import Recorder
from services.proxy.render import ReusableOutput
from services.proxy.router import Router
from services.proxy.service import ProxyServicer

NAME = "proxy"
MIGRATIONS = Path(__file__).with_name("migrations")
log = structlog.get_logger(__name__)


@dataclass(slots=True, kw_only=True)
class Proxy:
    host: ServiceHost
    calls: Calls
    http_url: str


async def build_proxy(settings: ProxySettings, kernel: KernelSettings) -> Proxy:
    sys.setswitchinterval(settings.thread_switch_interval_s)
    model = _load_or_none(settings)
    conns = await connect(kernel, service=NAME, migrations=MIGRATIONS)
    relay = OutboxRelay(conns.engine, conns.bus, repo.outbox, poll_s=0.2)
    async with conns.sessions() as session:
        routes = await repo.load_routes(session)
    pool = EnginePool()
    router = Router(pool, routes, version_wait_s=settings.weights_wait_s)
    metrics.register(router)
    recorder = Recorder(conns.sessions, relay)

    async def load_outputs(execution_id: str) -> list[ReusableOutput]:
        async with conns.sessions() as session:
            return await repo.load_outputs(session, execution_id)

    async def load_answers(execution_id: str) -> list[StoredAnswer]:
        async with conns.sessions() as session:
            rows = await repo.load_answers(session, execution_id)
        return [answer_from_json(CallKey(k, k.startswith("k:")), a, delivered=d) for k, a, d in rows]

    calls = Calls(
        model=model,
        router=router,
        recorder=recorder,
        load_outputs=load_outputs,
        load_answers=load_answers,
        load_model=lambda: _load_or_none(settings),
        engine_stall_s=settings.engine_stall_s,
        renders_per_execution=settings.renders_per_execution,
        refusal_wait_max_s=settings.refusal_wait_max_s,
    )
    recorder.on_lost = calls.forget_lost
    tokens = TokenBook(conns.sessions, cache_s=settings.token_cache_s)
    peers = _peers(settings)
    link = PeerLink(peers, tokens) if peers else None
    server = GrpcServer(
        service_names=[proxy_pb2.DESCRIPTOR.services_by_name["ProxyService"].full_name],
        host=settings.host,
        port=settings.port,
    )
    proxy_pb2_grpc.add_ProxyServiceServicer_to_server(
        ProxyServicer(conns.sessions, relay, calls=calls, tokens=tokens, link=link), server.server
    )
    app = build_app(
        calls=calls,
        tokens=tokens,
        failed_calls=FailedCalls(conns.sessions),
        max_body_bytes=settings.max_body_bytes,
        pin=pin_middleware(link) if link else None,
    )
    if link:
        add_control_routes(app, link=link, calls=calls)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    workers = [relay.run, recorder.run]
    if peers:
        # The shared port is bound (not yet listening) first, so the others can join it, and
        # it listens only once they all serve: a /health answer means every process is up.
        shared = shared_socket(settings.host, settings.http_port)
        port = shared.getsockname()[1]
        await web.TCPSite(runner, settings.host, int(peers.urls[peers.index].rsplit(":", 1)[1])).start()
        if peers.index == 0:
            children = Children(peers, http_port=port, settings=settings, kernel=kernel)
            await children.start()
            workers.append(children.watch)
        await web.SockSite(runner, shared).start()
    else:
        await web.TCPSite(runner, settings.host, settings.http_port).start()
        port = runner.addresses[0][1]
    http_url = f"http://{settings.host}:{port}"
    log.info("proxy_http_listening", url=http_url, model=model.name if model else None, peers=peers)

    async def serve_http(stop: asyncio.Event) -> None:
        await stop.wait()
        await runner.cleanup()
        await pool.close()
        if link:
            await link.close()
        calls.shutdown()

    host = ServiceHost(name=NAME, server=server, connections=conns, workers=[*workers, serve_http])
    return Proxy(host=host, calls=calls, http_url=http_url)


def _peers(settings: ProxySettings) -> Peers | None:
    """None for a lone proxy; process 0 plans its peers; the others read theirs from settings."""
    if settings.processes == 1 and not settings.peer_urls:
        return None
    if settings.process_index == 0:
        return plan_peers(settings.host, settings.processes)
    urls = tuple(settings.peer_urls.split(","))
    return Peers(index=settings.process_index, urls=urls, secret=settings.peer_secret)


def _load_or_none(settings: ProxySettings) -> ServedModel | None:
    """A missing model folder leaves the APIs answering 503 rather than the process down."""
    try:
        return load_model(
            settings.model_dir, name=settings.model_name, context_window_tokens=settings.context_window_tokens
        )
    except GyreError as exc:
        log.warning("proxy_model_missing", error=exc.message)
        return None


async def build(settings: ProxySettings, kernel: KernelSettings) -> ServiceHost:
    return (await build_proxy(settings, kernel)).host
