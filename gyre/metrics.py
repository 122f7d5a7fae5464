"""Prometheus metrics: the kernel's own series, a `/metrics` endpoint, and gauges services add (shell).

The kernel measures what every service shares: RPC latency per method and status (the gRPC
interceptor), events handled per consumer and outcome, each consumer's pending messages (its
lag), dead letters, events published, and how long events waited in an outbox. A service adds
the gauges it owns with `register_gauge`, from its wiring, reading state it already holds; the
value is read when scraped, on the event loop's thread (the endpoint runs there), so a reader
never races the service's own coroutines.

A service can also observe the events it publishes (`on_published`): a step's staleness, a
reward, as the bus accepts them. The endpoint is off unless `GYRE_METRICS_PORT` is set (0: a
free port, logged as `metrics_listening`); it binds `GYRE_METRICS_HOST` (default 127.0.0.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from google.protobuf import message
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gyre.common.v1 import envelope_pb2

log = structlog.get_logger(__name__)

RPC_SECONDS = Histogram(
    "gyre_rpc_duration_seconds",
    "Time a gRPC method took on the server, by method and status code.",
    ["method", "code"],
)
EVENTS_HANDLED = Counter(
    "gyre_events_handled_total",
    "Events a consumer finished with: ok (acked), retried (handler failed, redelivered later) or "
    "dead_lettered.",
    ["consumer", "event_type", "outcome"],
)
CONSUMER_WAITING = Gauge(
    "gyre_consumer_waiting_for_dependency",
    "1 while the consumer holds its batch and waits for Postgres or NATS to come back, else 0.",
    ["consumer"],
)
CONSUMER_PENDING = Gauge(
    "gyre_consumer_pending_messages",
    "Messages of its stream the consumer has not been delivered yet (its lag), as of its last fetch.",
    ["consumer"],
)
DEAD_LETTERS = Counter(
    "gyre_dead_letters_total", "Messages parked on the dead-letter stream, by consumer.", ["consumer"]
)
EVENTS_PUBLISHED = Counter("gyre_events_published_total", "Events published on the bus.", ["event_type"])
OUTBOX_WAIT_SECONDS = Histogram(
    "gyre_outbox_wait_seconds",
    "From an event's occurred_at to its publication by the outbox relay.",
    ["producer"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

EVENT_LAG_SECONDS = Histogram(
    "gyre_event_lag_seconds",
    "From an event's storage in its JetStream stream (its publication) to its fetch by a consumer.",
    ["consumer"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)

Reading = Callable[[], float | Mapping[str, float]]
M = TypeVar("M", bound=message.Message)


class ServiceGauges(Collector):
    """Gauges read at scrape time. A reading is one value, or one value per label value of `key`."""

    def __init__(self) -> None:
        self._gauges: dict[str, tuple[str, str | None, dict[tuple[tuple[str, str], ...], Reading]]] = {}

    def add(
        self,
        name: str,
        doc: str,
        read: Reading,
        *,
        labels: Mapping[str, str] | None = None,
        key: str | None = None,
    ) -> None:
        fixed = tuple(sorted((labels or {}).items()))
        known = self._gauges.get(name)
        if known is not None and (known[0], known[1]) != (doc, key):
            raise ValueError(f"gauge {name} is already registered with another description or key")
        readers = known[2] if known is not None else {}
        # The same gauge and labels again (a service rebuilt in-process): the new reader wins.
        readers[fixed] = read
        self._gauges[name] = (doc, key, readers)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, (doc, key, readers) in self._gauges.items():
            label_names = sorted({k for fixed in readers for k, _ in fixed} | ({key} if key else set()))
            family = GaugeMetricFamily(name, doc, labels=label_names)
            for fixed, read in readers.items():
                try:
                    value = read()
                except Exception as exc:  # a broken reader must not take the other series down
                    log.warning("gauge_read_failed", gauge=name, error=repr(exc))
                    continue
                values = value.items() if isinstance(value, Mapping) else [("", value)]
                for key_value, number in values:
                    series = dict(fixed) | ({key: key_value} if key else {})
                    family.add_metric([series.get(n, "") for n in label_names], float(number))
            yield family


_SERVICE_GAUGES = ServiceGauges()
REGISTRY.register(_SERVICE_GAUGES)


def register_gauge(
    name: str, doc: str, read: Reading, *, labels: Mapping[str, str] | None = None, key: str | None = None
) -> None:
    """Add a gauge a service owns, read when scraped.

    Example:
        register_gauge("gyre_engine_output_tokens_per_second", "...",
                       lambda: backend.stats().output_tokens_per_s, labels={"engine_id": "engine-0"})
        register_gauge("gyre_proxy_cells", "...", router.cells_by_state, key="state")
          -> gyre_proxy_cells{state="serving"} 2, gyre_proxy_cells{state="draining"} 1
    """
    _SERVICE_GAUGES.add(name, doc, read, labels=labels, key=key)


_PUBLISHED: dict[str, list[tuple[type[message.Message], Callable[[Any], None]]]] = {}


def on_published(event_cls: type[M], observe: Callable[[M], None]) -> None:
    """Call `observe(payload)` for every event of this class the process publishes, once the bus
    accepted it: how a service turns the facts it produces (a step, a reward) into its own series.

    Example:
        on_published(StepCompleted, lambda step: STALENESS.set(step.staleness_mean_steps))
    """
    observers = _PUBLISHED.setdefault(event_cls.DESCRIPTOR.full_name, [])
    if (event_cls, observe) not in observers:  # a service built twice in one process counts once
        observers.append((event_cls, observe))


def observe_published(envelope: envelope_pb2.Envelope) -> None:
    for event_cls, observe in _PUBLISHED.get(envelope.event_type, ()):
        payload = event_cls()
        if envelope.payload.Unpack(payload):
            try:
                observe(payload)
            except Exception as exc:  # a metric must never fail a publish
                log.warning("event_observer_failed", event_type=envelope.event_type, error=repr(exc))


@dataclass(slots=True)
class MetricsEndpoint:
    """A minimal HTTP server on the event loop that answers every GET with the registry's text."""

    server: asyncio.Server
    url: str

    async def close(self) -> None:
        self.server.close()
        await self.server.wait_closed()


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10.0)
        if request.startswith(b"GET "):
            body, status = generate_latest(REGISTRY), b"200 OK"
        else:
            body, status = b"only GET is served\n", b"405 Method Not Allowed"
        writer.write(
            b"HTTP/1.1 "
            + status
            + b"\r\nContent-Type: "
            + CONTENT_TYPE_LATEST.encode()
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        await writer.drain()
    except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass  # a scraper that went away or sent nothing sensible gets nothing
    finally:
        writer.close()


async def serve_metrics(host: str, port: int) -> MetricsEndpoint:
    server = await asyncio.start_server(_answer, host, port)
    bound = server.sockets[0].getsockname()[1]
    url = f"http://{host}:{bound}/metrics"
    log.info("metrics_listening", url=url)
    return MetricsEndpoint(server=server, url=url)
