"""Durable pull consumers: decode, hand to the service, ack after its commit (shell).

The contract (DESIGN section 5): a handler applies an event and records `(consumer, event_id)`
in the same transaction (see `gyre.db.inbox`); the message is acked only after that commit.
A crash before the ack means redelivery, which the inbox turns into a no-op. A consumer with an
`Inbox` (every database-backed one) applies each fetched batch in one transaction through
`gyre.db.inbox.apply_batch`; one without (an engine following weights) runs plain handlers one
message at a time. A message that can never be decoded is dead-lettered with the reason at
once; one whose handler keeps failing is retried with back-off and dead-lettered after
`max_deliver` attempts, unless it raises `InvalidArgument` or `UndecodableEvent` (the event
itself is wrong), which dead-letters at once. Nothing is dropped silently.

An outage is not a failure. When a batch fails, the consumer probes its bus and database
(`gyre.settle.after_failure` decides): while one is away it keeps the batch in hand (reporting
progress, so the server does not redeliver it), stops fetching, probes until both answer and
applies the batch again. The outage costs no delivery and never dead-letters, however long.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

import nats.errors
import structlog
from google.protobuf import message
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gyre.bus import Bus
from gyre.db.inbox import Inbox, apply_batch, give_up
from gyre.errors import InvalidArgument
from gyre.events import (
    DecodedEvent,
    UndecodableEvent,
    parse_envelope,
    stream_name,
    subject_for,
    type_map,
    unpack_payload,
)
from gyre.logs import bind_ids
from gyre.metrics import CONSUMER_PENDING, CONSUMER_WAITING, EVENT_LAG_SECONDS, EVENTS_HANDLED
from gyre.outages import database_answers, failure_fate, is_outage
from gyre.settle import APPLIED, Action, Fate, Hold, Limits, Outcome, after_failure, probe_delay_s, settle
from gyre.tracing import TRACE_HEADERS, continued_from

log = structlog.get_logger(__name__)

Handler = Callable[[DecodedEvent], Awaitable[None]]
T = TypeVar("T")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumerSpec:
    durable: str
    """Durable consumer name, unique per (consuming service, purpose), e.g. `trajectory-tasks`."""
    producer: str
    """The producing service whose stream is read."""
    handlers: Mapping[type[message.Message], Handler] = field(default_factory=dict)
    """Plain handlers, one per event class (for a consumer without a database)."""
    inbox: Inbox | None = None
    """In-transaction handlers with the exactly-once record; the stream is filtered to the
    event classes of `handlers` and of the inbox."""
    batch: int = 64
    max_deliver: int = 5
    ack_wait_s: float = 60.0
    fetch_timeout_s: float = 1.0
    retry_base_s: float = 1.0
    """First back-off after a handler failure; doubles per delivery, capped at 30 s."""
    progress_every_s: float = 0.0
    """When > 0, a handler still running tells the server every this many seconds that it is in
    progress, so a long handler (grading) can keep a short `ack_wait_s`: a consumer killed
    mid-handler is redelivered after `ack_wait_s`, not after the longest handler could take."""
    subscribe_retry_max_s: float = 30.0
    """Longest back-off between attempts to create the stream or the consumer (a busy server
    times out): they are retried until the service stops, never given up."""
    max_wait_deliver: int = 0
    """Deliveries an event may spend waiting for an earlier one it depends on (a consumer that
    naks it as not applicable yet) before it is dead-lettered; 0: as `max_deliver`. With the
    30 s cap, 30 deliveries wait about 12 minutes."""
    wait_retry_max_s: float = 30.0
    """Longest back-off between deliveries of an event that waits (see `max_wait_deliver`)."""
    database: async_sessionmaker[AsyncSession] | None = None
    """The database plain `handlers` use, if any: probed with the bus when one fails, so its
    outage is waited out (an inbox's database is probed without this)."""
    probe_max_s: float = 5.0
    """Longest pause between probes of a dependency that is away."""

    @property
    def server_max_deliver(self) -> int:
        # The server would stop redelivering past this; we dead-letter one delivery earlier.
        return max(self.max_deliver, self.max_wait_deliver) + 1

    def retry_delay_s(self, num_delivered: int) -> float:
        return self.limits.delay_s(num_delivered)

    @property
    def limits(self) -> Limits:
        return Limits(self.max_deliver, self.max_wait_deliver, self.retry_base_s, self.wait_retry_max_s)

    @property
    def event_types(self) -> list[type[message.Message]]:
        return [*self.handlers, *(self.inbox.types if self.inbox else ())]


class Consumer:
    """One durable pull consumer bound to one producer's stream."""

    def __init__(self, bus: Bus, spec: ConsumerSpec) -> None:
        self.bus = bus
        self.spec = spec
        self.types = type_map(spec.event_types)
        self.handlers = {cls.DESCRIPTOR.full_name: h for cls, h in spec.handlers.items()}
        self.processed = 0
        self.dead_lettered = 0
        self.outages_waited = 0
        self._stop = asyncio.Event()

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        stream = await self.bus.ensure_stream(self.spec.producer)
        subjects = sorted(subject_for(t, prefix=self.bus.prefix) for t in self.types)
        config = ConsumerConfig(
            durable_name=self.spec.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            max_deliver=self.spec.server_max_deliver,
            ack_wait=self.spec.ack_wait_s,
        )
        # A single filter_subject works on every JetStream server; filter_subjects needs 2.10+.
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = subjects
        assert stream == stream_name(self.spec.producer, prefix=self.bus.prefix)
        return await self.bus.js.pull_subscribe(
            subjects[0], durable=self.spec.durable, stream=stream, config=config
        )

    async def _subscribe_retrying(self, stop: asyncio.Event) -> JetStreamContext.PullSubscription | None:
        """`_subscribe`, retried with a bounded back-off until it works or `stop` is set."""
        for attempt in range(1_000_000):  # bounded by `stop`; the back-off caps each wait
            try:
                return await self._subscribe()
            except (TimeoutError, nats.errors.Error) as exc:
                delay_s = min(self.spec.subscribe_retry_max_s, 0.5 * 2.0**attempt)
                log.warning(
                    "consumer_subscribe_failed",
                    consumer=self.spec.durable,
                    error=f"{type(exc).__name__}: {exc}",
                    retry_in_s=delay_s,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=delay_s)
                if stop.is_set():
                    return None
        return None

    async def run(self, stop: asyncio.Event) -> None:
        """Process messages until `stop` is set; every fetch is bounded by `fetch_timeout_s`."""
        self._stop = stop
        sub = await self._subscribe_retrying(stop)
        if sub is None:
            return
        log.info("consumer_started", consumer=self.spec.durable, producer=self.spec.producer)
        while not stop.is_set():
            if not self.bus.nc.is_connected:  # no fetch while the bus is away: wait for it
                if not await self._wait_out(["nats"], []):
                    break
            try:
                msgs = await sub.fetch(self.spec.batch, timeout=self.spec.fetch_timeout_s)
            except (TimeoutError, NatsTimeoutError):
                CONSUMER_PENDING.labels(consumer=self.spec.durable).set(0)  # nothing was waiting
                continue
            except Exception as exc:
                if not is_outage(exc):  # a deleted stream or consumer, say: the worker's guard decides
                    raise
                if not await self._wait_out(await self.dependencies_away() or ["nats"], []):
                    break
                continue
            _observe_lag(self.spec.durable, msgs)
            if self.spec.inbox is not None:
                await self.handle_batch(msgs)
            else:
                for msg in msgs:
                    await self.handle(msg)
            if msgs:  # each message's metadata counts what is left behind it
                CONSUMER_PENDING.labels(consumer=self.spec.durable).set(msgs[-1].metadata.num_pending)
        await sub.unsubscribe()

    async def handle(self, msg: Msg) -> None:
        structlog.contextvars.clear_contextvars()
        try:
            event = await self._decode(msg)
        except UndecodableEvent as exc:
            await self._give_up(msg, f"undecodable: {exc}")
            return
        if event is None:  # a type this consumer does not handle (filtered out normally)
            await msg.ack()
            return
        structlog.contextvars.bind_contextvars(
            event_id=event.event_id, correlation_id=event.envelope.correlation_id
        )
        bind_ids(event.payload)
        event_type = event.envelope.event_type
        with continued_from(self._trace_carrier(msg, event), f"consume {event_type}"):
            outcome = await self._apply(msg, event)
        EVENTS_HANDLED.labels(consumer=self.spec.durable, event_type=event_type, outcome=outcome).inc()

    @staticmethod
    def _trace_carrier(msg: Msg, event: DecodedEvent) -> dict[str, str]:
        """The NATS headers' trace context; the envelope's copy for a message published without one."""
        headers = {k.lower(): v for k, v in (msg.headers or {}).items() if k.lower() in TRACE_HEADERS}
        return headers or dict(event.envelope.trace_context)

    async def _apply(self, msg: Msg, event: DecodedEvent) -> str:
        """Run a plain handler; ack, retry later or dead-letter. Returns which happened."""

        async def attempt() -> list[Outcome]:
            try:
                await self.handlers[event.envelope.event_type](event)
                return [APPLIED]
            except (UndecodableEvent, InvalidArgument) as exc:  # the event itself is wrong: no retry helps
                return [Outcome(Fate.INVALID, str(exc))]
            except Exception as exc:  # retried: the handler's transaction rolled back
                log.warning("handler_failed", consumer=self.spec.durable, error=repr(exc))
                return [Outcome(failure_fate(exc), f"{type(exc).__name__}: {exc}")]

        (outcome,) = await self._apply_through_outages([msg], attempt)
        return await self._settle(msg, outcome)

    async def _apply_through_outages(
        self, msgs: list[Msg], attempt: Callable[[], Awaitable[list[Outcome]]]
    ) -> list[Outcome]:
        """`attempt()` (one outcome per message), applied again for as long as its failures come
        from a dependency that is away; the outcomes to settle."""
        in_place = 0
        for _ in range(1_000_000):  # bounded by `stop`: each wait ends when the consumer stops
            outcomes = await self._with_progress(msgs, attempt())
            failed = [o for o in outcomes if o.fate in (Fate.FAILED, Fate.UNAVAILABLE)]
            if not failed:
                return outcomes
            away = await self.dependencies_away()
            hold = after_failure(
                dependencies_away=bool(away),
                outage_error=any(o.fate is Fate.UNAVAILABLE for o in failed),
                retried_in_place=in_place,
            )
            if hold is Hold.SETTLE:  # the handler's own failure: counted like any other
                return [Outcome(Fate.FAILED, o.reason) if o.fate is Fate.UNAVAILABLE else o for o in outcomes]
            if hold is Hold.WAIT:
                if not await self._wait_out(away, msgs):
                    return outcomes  # stopping: UNAVAILABLE is nak'd, never dead-lettered
                in_place = 0
            else:
                in_place += 1
        return outcomes

    async def dependencies_away(self) -> list[str]:
        """What of the bus and this consumer's database does not answer now ("nats", "postgres")."""
        away = [] if self.bus.nc.is_connected else ["nats"]
        database = self.spec.inbox.sessions if self.spec.inbox is not None else self.spec.database
        if database is not None and not await database_answers(database):
            away.append("postgres")
        return away

    async def _wait_out(self, away: list[str], msgs: list[Msg]) -> bool:
        """Hold `msgs` (telling the server they are in progress whenever it is reachable) and probe
        until nothing is away. False when the consumer is stopped first."""
        started = time.monotonic()
        self.outages_waited += 1
        CONSUMER_WAITING.labels(consumer=self.spec.durable).set(1)
        log.warning("consumer_waits_for_dependency", consumer=self.spec.durable, away=away, held=len(msgs))
        probes = 0
        try:
            while away:  # bounded by `stop`
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._stop.wait(), timeout=probe_delay_s(probes, cap_s=self.spec.probe_max_s)
                    )
                if self._stop.is_set():
                    return False
                probes += 1
                for msg in msgs if self.bus.nc.is_connected else ():
                    with contextlib.suppress(TimeoutError, nats.errors.Error):
                        await msg.in_progress()
                away = await self.dependencies_away()
        finally:
            CONSUMER_WAITING.labels(consumer=self.spec.durable).set(0)
        log.info(
            "consumer_resumed", consumer=self.spec.durable, waited_s=round(time.monotonic() - started, 1)
        )
        return True

    async def handle_batch(self, msgs: list[Msg]) -> None:
        """Decode a fetch, apply it in one transaction with the inbox, then settle each message."""
        assert self.spec.inbox is not None
        structlog.contextvars.clear_contextvars()
        decoded: list[tuple[Msg, DecodedEvent]] = []
        for msg in msgs:
            try:
                event = await self._decode(msg)
            except UndecodableEvent as exc:
                await self._give_up(msg, f"undecodable: {exc}")
                continue
            if event is None:
                await msg.ack()
            else:
                decoded.append((msg, event))
        if not decoded:
            return
        inbox, events = self.spec.inbox, [e for _, e in decoded]
        outcomes = await self._apply_through_outages(
            [m for m, _ in decoded], lambda: apply_batch(inbox, self.spec.durable, events)
        )
        for (msg, event), outcome in zip(decoded, outcomes, strict=True):
            structlog.contextvars.bind_contextvars(event_id=event.event_id)
            label = await self._settle(msg, outcome, event)
            EVENTS_HANDLED.labels(
                consumer=self.spec.durable, event_type=event.envelope.event_type, outcome=label
            ).inc()

    async def _settle(self, msg: Msg, outcome: Outcome, event: DecodedEvent | None = None) -> str:
        action: Action = settle(outcome, num_delivered=msg.metadata.num_delivered, limits=self.spec.limits)
        if action.kind == "ack":
            await msg.ack()
            self.processed += 1
        elif action.kind == "nak":
            if outcome.fate is Fate.WAITING:
                log.info("event_waits", consumer=self.spec.durable, reason=outcome.reason)
            await msg.nak(delay=action.delay_s)
        else:
            if event is not None and self.spec.inbox is not None and outcome.fate is not Fate.INVALID:
                await give_up(self.spec.inbox, event, action.reason)
            await self._give_up(msg, action.reason)
        return action.label

    async def _with_progress(self, msgs: list[Msg], work: Awaitable[T]) -> T:
        """Await `work`, telling the server every `progress_every_s` that `msgs` are in hand, so a
        long handler is not redelivered while it runs but is soon after its process dies."""
        handling = asyncio.ensure_future(work)
        every_s = self.spec.progress_every_s
        try:
            while every_s > 0:  # bounded: ends with the handler
                done, _ = await asyncio.wait({handling}, timeout=every_s)
                if done:
                    break
                for msg in msgs:
                    with contextlib.suppress(TimeoutError, nats.errors.Error):  # server away: redelivered
                        await msg.in_progress()
            return await handling
        finally:
            handling.cancel()  # only when this consumer was cancelled mid-handler

    async def _decode(self, msg: Msg) -> DecodedEvent | None:
        envelope = parse_envelope(msg.data)
        payload = await self.bus.load_payload(envelope)
        return unpack_payload(envelope, payload, self.types)

    async def _give_up(self, msg: Msg, reason: str) -> None:
        await self.bus.dead_letter(msg, consumer=self.spec.durable, reason=reason)
        await msg.term()
        self.dead_lettered += 1
        log.error("message_dead_lettered", consumer=self.spec.durable, subject=msg.subject, reason=reason)


def _observe_lag(consumer: str, msgs: list[Msg]) -> None:
    """Each fetched message's lag: now minus the time its stream stored it (a redelivery counts
    again, from the same time: the event waited that long)."""
    now = time.time()
    histogram = EVENT_LAG_SECONDS.labels(consumer=consumer)
    for msg in msgs:
        stored = msg.metadata.timestamp
        if stored is not None:
            histogram.observe(max(0.0, now - stored.timestamp()))
