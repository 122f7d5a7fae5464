"""Builders for proxy tests: a proxy in-process on the session's NATS and Postgres, scripted
engines behind it, execution tokens, and a reader of the LlmCallRecorded events it published."""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc

from bench.scripted_engine import ScriptedEngine, start_scripted_engine
from gyre.bus import Bus, BusConfig
from gyre.events import stream_name
from gyre.proxy.v1 import events_pb2, proxy_pb2, proxy_pb2_grpc
from gyre.rpc import GrpcServer
from gyre.settings import KernelSettings
from services.proxy.config import ProxySettings
from services.proxy.main import Proxy, build_proxy

END = "<|im_end|>"


def write_tokenizer(directory: Path) -> Path:
    """The tiny model's tokenizer and chat template alone (no weights): enough for the proxy."""
    from services.engine.model_init import build_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer().save_pretrained(directory)  # type: ignore[attr-defined]
    (directory / "config.json").write_text('{"max_position_embeddings": 16384}')
    return directory


@dataclass(slots=True)
class Scripter:
    """What the scripted engines answer: `replies` in turn (then `default`), as text."""

    tokenizer: Any
    replies: list[str] = field(default_factory=list)
    default: str = "Done."
    rule: Callable[[str], str | None] | None = None

    def __call__(self, prompt_ids: Sequence[int]) -> list[int]:
        text = None
        if self.rule is not None:
            text = self.rule(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        if text is None:
            text = self.replies.pop(0) if self.replies else self.default
        ids: list[int] = self.tokenizer.encode(text + END, add_special_tokens=False)
        return ids


@dataclass(slots=True)
class Rig:
    proxy: Proxy
    stub: Any
    channel: grpc.aio.Channel
    engines: list[tuple[GrpcServer, ScriptedEngine]]
    scripter: Scripter
    bus: Bus
    kernel: KernelSettings
    settings: ProxySettings

    @property
    def http_url(self) -> str:
        return self.proxy.http_url

    async def register_execution(self, *, ttl_s: float = 3600) -> tuple[str, str]:
        token = "gyre-" + secrets.token_hex(24)
        execution_id = str(uuid.uuid4())
        expires = datetime.now(UTC) + timedelta(seconds=ttl_s)
        request = proxy_pb2.RegisterExecutionTokenRequest(request_id=f"reg-{execution_id}", token=token)
        request.execution.execution_id = execution_id
        request.execution.task_id = str(uuid.uuid4())
        request.expires_at.FromDatetime(expires)
        await self.stub.RegisterExecutionToken(request)
        return token, execution_id

    async def records(
        self, execution_id: str, *, at_least: int, timeout_s: float = 10
    ) -> list[proxy_pb2.CallRecord]:
        """The execution's LlmCallRecorded calls, in publication order, once `at_least` arrived."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            found = [r for r in await read_records(self.bus) if r.execution_id == execution_id]
            if len(found) >= at_least or asyncio.get_running_loop().time() > deadline:
                return found
            await asyncio.sleep(0.1)

    async def restart_proxy(self) -> None:
        """Stop the proxy process state and build a new one on the same database (new ports)."""
        await self.channel.close(None)
        await self.proxy.host.stop(grace_s=1)
        self.proxy = await build_proxy(self.settings, self.kernel)
        await self.proxy.host.start()
        self.channel = grpc.aio.insecure_channel(self.proxy.host.address)
        self.stub = proxy_pb2_grpc.ProxyServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close(None)
        await self.proxy.host.stop(grace_s=1)
        for server, _ in self.engines:
            await server.stop(0.5)
        await self.bus.close()


async def read_records(bus: Bus) -> list[proxy_pb2.CallRecord]:
    subject = f"{bus.prefix}.proxy.v1.LlmCallRecorded"
    stream = stream_name("proxy", prefix=bus.prefix)
    try:
        sub = await bus.js.pull_subscribe(subject, durable=f"read{uuid.uuid4().hex[:10]}", stream=stream)
    except Exception:  # the stream does not exist until the first event
        return []
    out = []
    try:
        while True:
            msgs = await sub.fetch(256, timeout=0.5)
            for msg in msgs:
                from gyre.events import parse_envelope

                env = parse_envelope(msg.data)
                payload = await bus.load_payload(env)
                event = events_pb2.LlmCallRecorded()
                payload.Unpack(event)
                out.append(event.call)
                await msg.ack()
    except TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return out


async def start_rig(
    kernel: KernelSettings,
    model_dir: Path,
    *,
    num_engines: int = 2,
    token_interval_s: float = 0.0,
    context_window_tokens: int = 0,
    processes: int = 1,
) -> Rig:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    await _forget_routes(kernel)
    scripter = Scripter(tokenizer=tokenizer)
    settings = ProxySettings(
        model_dir=model_dir,
        model_name="tiny",
        context_window_tokens=context_window_tokens,
        processes=processes,
    )
    proxy = await build_proxy(settings, kernel)
    await proxy.host.start()
    channel = grpc.aio.insecure_channel(proxy.host.address)
    stub = proxy_pb2_grpc.ProxyServiceStub(channel)
    engines = []
    for i in range(1, num_engines + 1):
        server, engine = await start_scripted_engine(
            scripter, engine_id=f"engine-{i}", cell_id=f"cell-{i}", token_interval_s=token_interval_s
        )
        engines.append((server, engine))
        await stub.RegisterEngine(
            proxy_pb2.RegisterEngineRequest(
                request_id=f"eng-{uuid.uuid4().hex[:8]}",
                cell_id=f"cell-{i}",
                engine_id=f"engine-{i}",
                address=server.address,
            )
        )
    bus = await Bus.connect(BusConfig(url=kernel.nats_url or "", prefix=kernel.bus_prefix), name="proxy-test")
    return Rig(
        proxy=proxy,
        stub=stub,
        channel=channel,
        engines=engines,
        scripter=scripter,
        bus=bus,
        kernel=kernel,
        settings=settings,
    )


async def _forget_routes(kernel: KernelSettings) -> None:
    """Each rig brings its own engines; routes an earlier rig of this session stored are stale."""
    from gyre.db.engine import make_engine
    from gyre_app.migrations import upgrade

    assert kernel.database_url
    await asyncio.to_thread(upgrade, "proxy", kernel.database_url)
    engine = make_engine(kernel.database_url)
    async with engine.begin() as conn:
        await conn.exec_driver_sql("DELETE FROM proxy.engine_routes")
    await engine.dispose()


def prompt_of(record: proxy_pb2.CallRecord, earlier: dict[str, proxy_pb2.CallRecord]) -> list[int]:
    """Rebuild a record's exact prompt from its delta, as the trajectory service does."""
    if record.HasField("full_prompt"):
        return list(record.full_prompt.prompt_ids)
    delta = record.prompt_delta
    parent = earlier[delta.parent_call_id]
    context = [*prompt_of(parent, earlier), *parent.output_ids]
    return [*context[: delta.num_shared_tokens], *delta.new_ids]


GREEDY_MESSAGES = [{"role": "user", "content": "Fix the failing test and run the test suite again."}]


async def greedy_stream(
    http_url: str,
    token: str,
    *,
    max_tokens: int,
    during: Callable[[list[str]], Awaitable[None]] | None = None,
) -> str:
    """One greedy streaming chat call's text; `during(parts)` runs between chunks (it may switch
    cells, load weights)."""
    import openai

    client = openai.AsyncOpenAI(base_url=f"{http_url}/v1", api_key=token, max_retries=0)
    stream = await client.chat.completions.create(
        model="tiny",
        messages=GREEDY_MESSAGES,  # type: ignore[arg-type]
        stream=True,
        temperature=0,
        max_tokens=max_tokens,
    )
    parts: list[str] = []
    async for chunk in stream:
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
        if during is not None:
            await during(parts)
    return "".join(parts)
