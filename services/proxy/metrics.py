"""The proxy's Prometheus gauges, read from its routing table when scraped (shell)."""

from __future__ import annotations

from collections import Counter

from gyre.metrics import register_gauge
from services.proxy.router import Router


def register(router: Router) -> None:
    register_gauge(
        "gyre_proxy_routes",
        "Engines the proxy knows, by route state (active: serving calls; draining; drained): the "
        "cells' rollout roles as the proxy sees them.",
        lambda: dict(Counter(r.state for r in router.routes.values())),
        key="state",
    )
    register_gauge(
        "gyre_proxy_calls_in_flight",
        "Model calls generating now, by engine.",
        lambda: {engine_id: float(n) for engine_id, n in router.in_flight.items()},
        key="engine_id",
    )
    register_gauge(
        "gyre_proxy_calls_waiting_for_weights",
        "Model calls held until an engine has weights of their execution's admitted version.",
        lambda: float(router.num_waiting),
    )
