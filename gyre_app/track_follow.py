"""The tracker process: follow the bus, write a row per training step to every sink (shell).

It reads the producers' streams with ephemeral consumers that acknowledge nothing (no service's
durable consumer is touched, and the services know nothing of it), folds each event into a
`RunLedger`, and at each `StepCompleted` hands the step's row and sample table to the `Tracker`
and, with `atif`, writes the step's executions as ATIF files. Every stream but the trainer's is
read first at each poll, so a step's rewards, ends and calls are in before its row is made.
Live, it also asks each registered engine for its stats once a poll (`sample_engines`): KV use
and prefix hits are no event, only the engine's present state.

`gyre up` starts it detached (`python -m gyre_app.track_follow`, pid in `<state>/tracker.json`);
it exits when the stack is gone. `gyre track` runs `follow` once over a stack's history instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from google.protobuf import message
from nats.js import api
from nats.js.errors import NotFoundError

from gyre.bus import Bus, BusConfig
from gyre.devstack.processes import is_our_process, read_json, spawn_detached, terminate, write_json
from gyre.engine.v1 import engine_pb2, engine_pb2_grpc
from gyre.engine.v1 import events_pb2 as engine_events
from gyre.evaluator.v1 import events_pb2 as evaluator_events
from gyre.events import UndecodableEvent, parse_envelope, stream_name, subject_for, unpack_payload
from gyre.logs import configure_logging
from gyre.proxy.v1 import events_pb2 as proxy_events
from gyre.proxy.v1 import proxy_pb2
from gyre.runner.v1 import events_pb2 as runner_events
from gyre.runner.v1 import runner_pb2
from gyre.scheduler.v1 import events_pb2 as scheduler_events
from gyre.scheduler.v1 import scheduler_pb2
from gyre.settings import KernelSettings, resolve_urls, stack_state_path
from gyre.tls import aio_channel
from gyre.trainer.v1 import events_pb2 as trainer_events
from gyre_app.track_config import TrackSettings
from gyre_app.track_ledger import CallFacts, RunLedger, ToolCallFacts
from gyre_app.track_rows import EngineSample, StepFacts
from gyre_app.track_sinks import Tracker, parse_sinks

log = structlog.get_logger(__name__)
MARKER = "gyre_app.track_follow"
PID_FILE = "tracker.json"
FETCH_BATCH = 256
FETCH_TIMEOUT_S = 0.5
STATUS_FILE = "status.json"
ENGINE_STATS_TIMEOUT_S = 2.0
EngineSampler = Callable[[Sequence[str]], Awaitable[list[EngineSample]]]
"""Engine addresses in, one sample per engine that answered out."""

FED: tuple[tuple[str, type[message.Message]], ...] = (
    ("scheduler", scheduler_events.CellRegistered),
    ("scheduler", scheduler_events.CellRoleChanged),
    ("scheduler", scheduler_events.CellLost),
    ("proxy", proxy_events.LlmCallRecorded),
    ("runner", runner_events.ExecutionFinished),
    ("runner", runner_events.ExecutionTimedOut),
    ("runner", runner_events.ExecutionFailed),
    ("runner", runner_events.ExecutionCancelled),
    ("evaluator", evaluator_events.RewardAssigned),
    ("engine", engine_events.EngineWeightsUpdated),
    ("trainer", trainer_events.GroupSetAside),
    ("trainer", trainer_events.StepCompleted),  # last: see the module docstring
)
ROLES = {
    scheduler_pb2.CELL_ROLE_ROLLOUT: "rollout",
    scheduler_pb2.CELL_ROLE_TRAINING: "training",
    scheduler_pb2.CELL_ROLE_SWITCHING: "switching",
    scheduler_pb2.CELL_ROLE_LOST: "lost",
}
INFRASTRUCTURE_FAILURES = {
    runner_pb2.EXECUTION_FAILURE_KIND_HARNESS_CRASHED: "crashed",
}


class EventFeed:
    """One ephemeral pull consumer per event type; a stream that does not exist yet is tried again
    at the next poll (the tracker may start before a service has published anything)."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self.subs: dict[str, Any] = {}

    async def _subscription(self, service: str, kind: type[message.Message]) -> Any:
        event_type = kind.DESCRIPTOR.full_name
        if event_type not in self.subs:
            config = api.ConsumerConfig(
                ack_policy=api.AckPolicy.NONE, deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=60.0
            )
            try:
                self.subs[event_type] = await self.bus.js.pull_subscribe(
                    subject_for(event_type, prefix=self.bus.prefix),
                    stream=stream_name(service, prefix=self.bus.prefix),
                    config=config,
                )
            except NotFoundError:
                return None
        return self.subs[event_type]

    async def poll(self) -> list[tuple[datetime, message.Message]]:
        """Every event published since the last poll, stream by stream in `FED`'s order."""
        out: list[tuple[datetime, message.Message]] = []
        for service, kind in FED:
            sub = await self._subscription(service, kind)
            if sub is None:
                continue
            types = {kind.DESCRIPTOR.full_name: kind}
            while True:  # until a fetch comes back short: this stream is read up to now
                try:
                    msgs = await sub.fetch(FETCH_BATCH, timeout=FETCH_TIMEOUT_S)
                except TimeoutError:
                    break
                for msg in msgs:
                    try:
                        envelope = parse_envelope(msg.data)
                        event = unpack_payload(envelope, await self.bus.load_payload(envelope), types)
                    except UndecodableEvent:
                        continue
                    if event is not None:
                        out.append((envelope.occurred_at.ToDatetime(tzinfo=UTC), event.payload))
                if len(msgs) < FETCH_BATCH:
                    break
        return out

    async def close(self) -> None:
        for sub in self.subs.values():
            with contextlib.suppress(Exception):  # the server may already be gone at `gyre down`
                await sub.unsubscribe()


@dataclass(slots=True)
class Decoder:
    """Token ids to text and tool calls with the policy's tokenizer; absent: counts only."""

    decode: Callable[[Sequence[int]], str] | None
    template: str = ""

    @classmethod
    def load(cls, folder: Path | None) -> Decoder:
        if folder is None or not (folder / "tokenizer_config.json").is_file():
            return cls(decode=None)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(folder)  # type: ignore[no-untyped-call]
        return cls(
            decode=lambda ids: str(tokenizer.decode(list(ids))),
            template=str(getattr(tokenizer, "chat_template", "") or ""),
        )

    def call(self, record: proxy_pb2.CallRecord) -> CallFacts:
        from services.proxy.toolcalls import ToolCallFormat, parse_output

        full = record.WhichOneof("prompt") == "full_prompt"
        prompt_ids = list(record.full_prompt.prompt_ids) if full else []
        base = CallFacts(
            call_id=record.call_id,
            execution_id=record.execution_id,
            agent_id=record.agent_id,
            started_s=record.started_at.ToDatetime(tzinfo=UTC).timestamp(),
            finished_s=record.finished_at.ToDatetime(tzinfo=UTC).timestamp(),
            num_prompt_tokens=len(prompt_ids),
            num_output_tokens=len(record.output_ids),
            hit_context=record.finish_reason == proxy_pb2.CALL_FINISH_REASON_CONTEXT_LENGTH,
            decoded=self.decode is not None,
        )
        if self.decode is None:
            return base
        output = self.decode(record.output_ids)
        parsed = parse_output(output, fmt=ToolCallFormat.from_template(self.template), call_ids=())
        return dataclasses.replace(
            base,
            prompt_text=self.decode(prompt_ids) if prompt_ids else "",
            output_text=output,
            tool_calls=tuple(
                ToolCallFacts(name=t.name, arguments=json.dumps(t.arguments)) for t in parsed.tool_calls
            ),
            num_malformed_tool_calls=parsed.malformed,
        )


def _ending(event: message.Message) -> str:
    if isinstance(event, runner_events.ExecutionFinished):
        return "done"
    if isinstance(event, runner_events.ExecutionTimedOut):
        return "turn_budget" if event.limit == runner_events.TIMEOUT_LIMIT_HARNESS_BUDGET else "timeout"
    if isinstance(event, runner_events.ExecutionFailed):
        return INFRASTRUCTURE_FAILURES.get(event.failure.kind, "infrastructure")
    return "cancelled"


def apply(ledger: RunLedger, event: message.Message, decoder: Decoder) -> StepFacts | None:
    """Record one event; a `StepCompleted` comes back as the step to complete."""
    if isinstance(event, trainer_events.StepCompleted):
        return StepFacts(
            step=int(event.version.steps),
            task_ids=tuple(event.task_ids),
            num_groups=event.num_groups_consumed,
            num_samples=event.num_samples,
            num_target_tokens=event.num_target_tokens,
            staleness_mean=event.staleness_mean_steps,
            staleness_max=event.staleness_max_steps,
            num_dropped_stale=event.num_samples_dropped_stale,
            loss=event.loss,
            grad_norm=event.grad_norm,
            duration_s=event.duration_s,
        )
    if isinstance(event, trainer_events.GroupSetAside):
        ledger.forget_task(event.task_id)
    elif isinstance(event, evaluator_events.RewardAssigned):
        grade = event.grade
        ledger.record_reward(
            execution_id=grade.execution_id,
            task_id=grade.task_id,
            reward=grade.score,
            assessable=grade.assessable,
        )
    elif isinstance(
        event,
        runner_events.ExecutionFinished
        | runner_events.ExecutionTimedOut
        | runner_events.ExecutionFailed
        | runner_events.ExecutionCancelled,
    ):
        ref = event.execution
        ledger.record_ending(execution_id=ref.execution_id, task_id=ref.task_id, ending=_ending(event))
    elif isinstance(event, proxy_events.LlmCallRecorded):
        ledger.record_call(decoder.call(event.call))
    elif isinstance(event, engine_events.EngineWeightsUpdated):
        ledger.record_weight_load(event.duration_s)
    elif isinstance(event, scheduler_events.CellRegistered):
        ledger.record_cell_role(event.cell.cell_id, ROLES.get(event.cell.role, "switching"))
        ledger.record_engine_address(event.cell.cell_id, event.cell.engine_address)
    elif isinstance(event, scheduler_events.CellRoleChanged):
        ledger.record_cell_role(event.switch.cell_id, ROLES.get(event.switch.to_role, "switching"))
    elif isinstance(event, scheduler_events.CellLost):
        ledger.record_cell_role(event.cell_id, "lost")
    return None


async def sample_engines(addresses: Sequence[str]) -> list[EngineSample]:
    """Each engine's `GetEngineStats` now; one that does not answer in time is skipped (it may be
    restarting: the run goes on, and so does the tracker)."""

    async def one(address: str) -> EngineSample | None:
        try:
            async with aio_channel(address) as channel:
                stub = engine_pb2_grpc.EngineServiceStub(channel)
                stats = await stub.GetEngineStats(
                    engine_pb2.GetEngineStatsRequest(), timeout=ENGINE_STATS_TIMEOUT_S
                )
        except Exception as exc:
            log.debug("tracker_engine_stats_failed", address=address, error=repr(exc))
            return None
        return EngineSample(
            engine_id=stats.engine_id or address,
            kv_tokens_used=stats.num_kv_cache_tokens_used,
            kv_tokens_total=stats.num_kv_cache_tokens_total,
            prefill_tokens=stats.num_prefill_tokens,
            prefix_hit_tokens=stats.num_prefix_cache_hit_tokens,
        )

    answers = await asyncio.gather(*(one(a) for a in sorted(set(addresses))))
    return [a for a in answers if a is not None]


@dataclass(frozen=True, slots=True, kw_only=True)
class FollowResult:
    steps: list[int]
    failures: dict[str, int]
    rows_logged: dict[str, int]


async def follow(
    bus: Bus,
    settings: TrackSettings,
    folder: Path,
    *,
    sinks: Sequence[str],
    tokenizer_dir: Path | None,
    keep_going: Callable[[list[int]], bool],
    engine_sampler: EngineSampler | None = None,
) -> FollowResult:
    """Poll the bus and log each step until `keep_going(steps so far)` says stop.

    With `engine_sampler`, the engines the cells registered are sampled once a poll: before the
    poll's first step row (after the registrations read with it), else at the poll's end.
    """
    run_name = settings.resolved_run_name()
    tracker = Tracker.open(sinks, folder, project=settings.project, run_name=run_name)
    ledger = RunLedger(samples_per_step=settings.samples_per_step, run_name=run_name)
    decoder = Decoder.load(tokenizer_dir)
    feed = EventFeed(bus)
    steps: list[int] = []
    _write_status(folder, tracker, steps)
    try:
        while keep_going(steps):
            try:
                events = await feed.poll()
            except Exception as exc:  # the bus restarting: the run goes on, so does the tracker
                log.warning("tracker_poll_failed", error=repr(exc))
                events = []
            sampled = engine_sampler is None
            for _, event in events:
                step = apply(ledger, event, decoder)
                if step is None:
                    continue
                if not sampled:
                    ledger.record_engine_samples(await _sample(engine_sampler, ledger))
                    sampled = True
                out = ledger.complete_step(step)
                tracker.log_row(out.row)
                tracker.log_samples(step.step, out.samples)
                if settings.atif:
                    _write_atif(folder / "atif" / f"step-{step.step:08d}", out.trajectories)
                steps.append(step.step)
                _write_status(folder, tracker, steps)
            if not sampled:
                ledger.record_engine_samples(await _sample(engine_sampler, ledger))
            if keep_going(steps):
                await asyncio.sleep(settings.poll_s)
    finally:
        tracker.close()
        await feed.close()
        _write_status(folder, tracker, steps)
    return FollowResult(steps=steps, failures=dict(tracker.failures), rows_logged=dict(tracker.rows_logged))


async def _sample(sampler: EngineSampler | None, ledger: RunLedger) -> list[EngineSample]:
    if sampler is None or not ledger.engine_addresses:
        return []
    try:
        return await sampler(list(ledger.engine_addresses.values()))
    except Exception as exc:  # a sampler's own failure costs the figures, never the row
        log.warning("tracker_engine_sampling_failed", error=repr(exc))
        return []


def _write_atif(folder: Path, trajectories: dict[str, dict[str, Any]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for execution_id, trajectory in trajectories.items():
        (folder / f"{execution_id}.json").write_text(json.dumps(trajectory, indent=1) + "\n")


def _write_status(folder: Path, tracker: Tracker, steps: list[int]) -> None:
    status = {
        "steps": len(steps),
        "last_step": steps[-1] if steps else None,
        "sinks": [s.name for s in tracker.sinks],
        "rows_logged": tracker.rows_logged,
        "failures": tracker.failures,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / STATUS_FILE).write_text(json.dumps(status, indent=2) + "\n")


def track_folder(settings: TrackSettings, state_dir: Path, run_name: str) -> Path:
    return settings.dir or state_dir / "track" / run_name


def start_tracker(kernel: KernelSettings, env: dict[str, str], cwd: Path, *, sinks: Sequence[str]) -> Path:
    """Spawn the tracker for the stack in `kernel.state_dir` (detached); returns its folder.

    One already following this stack with the same sinks is kept (a repeated `gyre up` does not
    start a second run); with other sinks it is replaced.
    """
    state_dir = kernel.state_dir.resolve()
    recorded = read_json(state_dir / PID_FILE) or {}
    pid = recorded.get("pid")
    if isinstance(pid, int) and is_our_process(pid, MARKER) and recorded.get("sinks") == list(sinks):
        return Path(str(recorded["folder"]))
    stop_tracker(state_dir)
    settings = TrackSettings()
    run_name = settings.resolved_run_name()
    folder = track_folder(settings, state_dir, run_name).resolve()
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    pid = spawn_detached(
        [sys.executable, "-m", MARKER],
        log_path=state_dir / "logs" / "tracker.log",
        cwd=cwd,
        env={
            **env,
            "GYRE_STATE_DIR": str(state_dir),
            "GYRE_BUS_PREFIX": kernel.bus_prefix,
            "GYRE_TRACK_SINKS": ",".join(sinks),
            "GYRE_TRACK_RUN_NAME": run_name,
            "GYRE_TRACK_DIR": str(folder),
        },
    )
    write_json(state_dir / PID_FILE, {"pid": pid, "folder": str(folder), "sinks": list(sinks)})
    return folder


def stop_tracker(state_dir: Path) -> bool:
    recorded = read_json(state_dir / PID_FILE) or {}
    pid = recorded.get("pid")
    (state_dir / PID_FILE).unlink(missing_ok=True)
    return isinstance(pid, int) and terminate(pid, MARKER, timeout_s=10.0)


def main() -> int:
    kernel = KernelSettings()
    configure_logging(fmt=kernel.log_format, level=kernel.log_level)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    settings = TrackSettings()
    state_dir = kernel.state_dir.resolve()
    sinks = parse_sinks(settings.sinks, field_name="GYRE_TRACK_SINKS")
    folder = track_folder(settings, state_dir, settings.resolved_run_name())
    tokenizer_dir = settings.tokenizer_dir or state_dir / "model"
    state_path = stack_state_path(state_dir)

    async def go() -> None:
        bus = await Bus.connect(
            BusConfig(url=resolve_urls(kernel).nats_url, prefix=kernel.bus_prefix), name="gyre-tracker"
        )
        try:
            await follow(
                bus,
                settings,
                folder,
                sinks=sinks,
                tokenizer_dir=tokenizer_dir,
                keep_going=lambda _: state_path.exists(),
                engine_sampler=sample_engines,
            )
        finally:
            with contextlib.suppress(Exception):
                await bus.close()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(go())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
