"""Where each service's gRPC API is: `GYRE_<SERVICE>_ADDRESS`, else the local stack (shell: env, file).

Example:
    GYRE_SCHEDULER_ADDRESS=10.0.0.5:50051 -> the scheduler there
    unset, `gyre up` ran -> the address `.gyre/stack.json` recorded for it
    unset, no stack -> the service's fixed default port when it has one (scheduler 50051,
    trajectory 50055), else an error saying how to start it or where to point
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gyre.errors import Unavailable
from gyre.settings import KernelSettings, stack_state_path

SERVICES = ("scheduler", "trajectory", "runner", "evaluator", "proxy", "trainer", "engine")
DEFAULT_ADDRESSES = {"scheduler": "127.0.0.1:50051", "trajectory": "127.0.0.1:50055"}


def how_to_start(service: str) -> str:
    return (
        f"start the stack with `gyre up` (or the service alone: `python -m services.{service}`), "
        f"or point GYRE_{service.upper()}_ADDRESS at a running one"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceAddresses:
    """`host:port` of each service's gRPC API that is known; `of` names the missing ones."""

    known: Mapping[str, str] = field(default_factory=dict)

    def of(self, service: str) -> str:
        try:
            return self.known[service]
        except KeyError:
            raise Unavailable(f"no address for the {service} service: {how_to_start(service)}") from None

    @classmethod
    def resolve(
        cls, kernel: KernelSettings | None = None, env: Mapping[str, str] | None = None
    ) -> ServiceAddresses:
        env = os.environ if env is None else env
        state_dir = (kernel or KernelSettings()).state_dir
        known = dict(DEFAULT_ADDRESSES)
        known.update(_stack_addresses(stack_state_path(state_dir)))
        for service in SERVICES:
            explicit = env.get(f"GYRE_{service.upper()}_ADDRESS")
            if explicit:
                known[service] = explicit
        return cls(known=known)


def _stack_addresses(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return {s["name"]: s["address"] for s in raw.get("services", []) if "name" in s and "address" in s}
