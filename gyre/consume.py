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
"""

from __future__ import annotations

import asyncio
import contextlib
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
from gyre.metrics import CONSUMER_PENDING, EVENTS_HANDLED
from gyre.settle import APPLIED, Action, Fate, Limits, Outcome, settle
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
        sub = await self._subscribe_retrying(stop)
        if sub is None:
            return
        log.info("consumer_started", consumer=self.spec.durable, producer=self.spec.producer)
        while not stop.is_set():
            try:
                msgs = await sub.fetch(self.spec.batch, timeout=self.spec.fetch_timeout_s)
            except (TimeoutError, NatsTimeoutError):
                CONSUMER_PENDING.labels(consumer=self.spec.durable).set(0)  # nothing was waiting
                continue
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
        try:
            await self._with_progress([msg], self.handlers[event.envelope.event_type](event))
            outcome = APPLIED
        except (UndecodableEvent, InvalidArgument) as exc:  # the event itself is wrong: no retry helps
            outcome = Outcome(Fate.INVALID, str(exc))
        except Exception as exc:  # retried: the handler's transaction rolled back
            outcome = Outcome(Fate.FAILED, f"{type(exc).__name__}: {exc}")
            log.warning("handler_failed", consumer=self.spec.durable, error=repr(exc))
        return await self._settle(msg, outcome)

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
        outcomes = await self._with_progress(
            [m for m, _ in decoded], apply_batch(self.spec.inbox, self.spec.durable, [e for _, e in decoded])
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
