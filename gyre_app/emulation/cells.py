"""Many emulated engines in one process, each serving the real EngineService on its own port (shell).

EMULATION ONLY. `EmulatedCells` builds one `EmulatedEngine` per satellite from a profile and
serves each through the real `EngineServicer` on a gRPC server of its own, so the proxy and the
scheduler reach it at an address exactly as they reach a real engine. With a bus, one durable
consumer of `WeightsPublished` applies each version to every engine through the engines' own
follower (`WeightsEvents.apply`, the path a real engine takes), instead of 256 consumers.

    python -m gyre_app.emulation.cells --profile bench/profiles/h100-emulated.yaml --cells 16

prints one JSON line mapping each cell id to its engine's address, then serves until stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from gyre.bus import Bus
from gyre.consume import Consumer, ConsumerSpec
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.errors import InvalidArgument
from gyre.events import DecodedEvent
from gyre.rpc import GrpcServer
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.emulation.profile import Profile, check_cells, engine_timing, load_profile
from services.engine.emulated_engine import EmulatedEngine
from services.engine.emulated_stream import EmulatedEngineConfig
from services.engine.follow import WeightsEvents
from services.engine.service import EngineServicer

log = structlog.get_logger(__name__)
ENGINE_SERVICE = engine_pb2.DESCRIPTOR.services_by_name["EngineService"].full_name


def vocabulary(model_dir: Path | None) -> tuple[int, int]:
    """(vocab_size, eos id) of the proxy's tokenizer, read from the checkpoint's config.json so the
    scripted ids detokenize (no transformers import); the tiny model's shape without one."""
    if model_dir is None or not (model_dir / "config.json").is_file():
        return 512, 2
    config = json.loads((model_dir / "config.json").read_text())
    eos = config.get("eos_token_id", 2)
    return int(config["vocab_size"]), int(eos[0] if isinstance(eos, list) else eos)


def available_memory_bytes() -> int:
    """MemAvailable of this machine (Linux), what the emulated cells may take."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


@dataclass(slots=True)
class EmulatedCells:
    profile: Profile
    engines: dict[str, EmulatedEngine] = field(default_factory=dict)
    servers: dict[str, GrpcServer] = field(default_factory=dict)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def addresses(self) -> dict[str, str]:
        return {cell: server.address for cell, server in self.servers.items()}

    async def start(
        self,
        cell_ids: Sequence[str],
        *,
        vocab_size: int,
        eos_id: int,
        time_scale: float = 1.0,
        reply_tokens: int = 64,
        tick_s: float = 0.02,
        bus: Bus | None = None,
    ) -> None:
        timing = engine_timing(self.profile)
        for cell in cell_ids:
            config = EmulatedEngineConfig(
                engine_id=f"engine-{cell}",
                cell_id=cell,
                model_id=self.profile.fingerprint,
                vocab_size=vocab_size,
                eos_id=eos_id,
                reply_tokens=reply_tokens,
                max_context_tokens=int(self.profile["model.max_context_tokens"]),
                time_scale=time_scale,
                tick_s=tick_s,
            )
            engine = EmulatedEngine(config, timing)
            server = GrpcServer(service_names=[ENGINE_SERVICE])
            engine_pb2_grpc.add_EngineServiceServicer_to_server(EngineServicer(engine), server.server)
            await server.start()
            self.engines[cell], self.servers[cell] = engine, server
            self._tasks.append(asyncio.create_task(engine.run(self.stop)))
        if bus is not None:
            followers = [WeightsEvents(e, engine_id=e.engine_id) for e in self.engines.values()]

            async def on_weights(event: DecodedEvent) -> None:
                # Every engine at once: a version reaches the cluster as one broadcast would.
                await asyncio.gather(
                    *(
                        f.apply(event.payload, request_id=f"weights-published:{event.event_id}")
                        for f in followers
                    )
                )

            spec = ConsumerSpec(
                durable=f"emulated-weights-{self.profile.name}",
                producer="trainer",
                handlers={trainer_events.WeightsPublished: on_weights},
                batch=1,
            )
            self._tasks.append(asyncio.create_task(Consumer(bus, spec).run(self.stop)))

    def busy_s(self) -> float:
        """Wall seconds all engines spent computing their ticks (the emulator's own load)."""
        return sum(e.busy_s for e in self.engines.values())

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(s.stop(0.2) for s in self.servers.values()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gyre_app.emulation.cells", description=__doc__)
    parser.add_argument("--profile", required=True, type=Path)
    parser.add_argument("--cells", required=True, type=int, help="satellite engines to serve")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--model-dir", type=Path, default=None, help="the proxy's checkpoint (vocabulary)")
    return parser


async def _serve(profile: Profile, cells: int, time_scale: float, model_dir: Path | None) -> None:
    vocab_size, eos_id = vocabulary(model_dir)
    host = EmulatedCells(profile)
    await host.start(
        [f"cell-{i}" for i in range(1, cells + 1)],
        vocab_size=vocab_size,
        eos_id=eos_id,
        time_scale=time_scale,
    )
    print(json.dumps({"label": "emulation only", "engines": host.addresses}), flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await host.close()


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        profile = load_profile(ns.profile)
        check_cells(profile, ns.cells + 1, available_bytes=available_memory_bytes())  # with the core
        if not ns.time_scale > 0:
            raise InvalidArgument("time_scale", f"must be > 0, got {ns.time_scale}")
    except InvalidArgument as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    asyncio.run(_serve(profile, ns.cells, ns.time_scale, ns.model_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
