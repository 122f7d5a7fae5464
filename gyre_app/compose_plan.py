"""What the compose smoke run brings up, in what order, built from what (pure).

deploy/docker-compose.yml is written for a machine with Docker and an image registry. The smoke
run (`make compose-smoke`, `gyre_app.compose_smoke`) brings the same file up with Podman on a
machine with neither, so it derives a run file from it (`smoke_compose`): the images built here
in place of the registry's and of `build:`, host ports that do not collide with servers already
on the machine, and lowered open-file and process limits (runc cannot raise them past the
host's). Everything else (commands, environment, volumes, health checks, dependencies) is the
deploy file's own.

Podman before 4.6 cannot wait for a container to be healthy, so podman-compose starts services
without honouring `condition: service_healthy` (it logs that it ignores it). `start_order` gives
the order the dependencies allow, and the smoke run starts each service once the conditions it
names hold, as Docker Compose does.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import unquote, urlparse

from gyre.errors import InvalidArgument

GYRE_IMAGE = "gyre:latest"
LIMITS = {"nofile": {"soft": 1024, "hard": 1024}, "nproc": {"soft": 1024, "hard": 1024}}
"""Each container's limits (the repo's other podman code passes the same `--ulimit`s)."""
NATS_CLIENT_PORT = 4222
PUBLISHED = ("nats", "scheduler", "trajectory", "engine")
"""What the demo reaches from the host: the bus, and the services it calls."""
CONDITIONS = ("service_started", "service_healthy", "service_completed_successfully")


@dataclass(frozen=True, slots=True, kw_only=True)
class Images:
    gyre: str
    nats: str
    postgres: str


def container_port(name: str, service: Mapping[str, Any]) -> int:
    """The port `name` serves inside: NATS's client port, or the `--port` of a Gyre service."""
    if name == "nats":
        return NATS_CLIENT_PORT
    command = list(service.get("command") or [])
    if "--port" not in command:
        raise InvalidArgument(f"services.{name}.command", "names no --port to publish")
    return int(command[command.index("--port") + 1])


def smoke_compose(
    compose: Mapping[str, Any], images: Images, host_ports: Mapping[str, int], binds: Mapping[str, str]
) -> dict[str, Any]:
    """The deploy file as the smoke run brings it up; `host_ports` maps each of `PUBLISHED` to a free
    port on 127.0.0.1 (nothing else is published: the machine's own NATS and Postgres keep theirs),
    `binds` each relative bind source (`./sandboxes`) to the host folder the run made for it.
    """
    missing = [name for name in PUBLISHED if name not in host_ports]
    if missing:
        raise InvalidArgument("host_ports", f"needs a port for {', '.join(missing)}")
    out = copy.deepcopy(dict(compose))
    out.pop("name", None)  # the smoke run names its own project
    for name, service in out["services"].items():
        if service.get("image") == GYRE_IMAGE:
            service["image"] = images.gyre
        elif name in ("nats", "postgres"):
            service["image"] = getattr(images, name)
        service.pop("build", None)
        service.pop("ports", None)
        if "volumes" in service:
            service["volumes"] = [_rebind(v, binds, name) for v in service["volumes"]]
        if name in PUBLISHED:
            service["ports"] = [f"127.0.0.1:{host_ports[name]}:{container_port(name, service)}"]
        service["ulimits"] = copy.deepcopy(LIMITS)
    return out


def _rebind(volume: str, binds: Mapping[str, str], service: str) -> str:
    source, _, rest = volume.partition(":")
    if not source.startswith("."):
        return volume  # a named volume
    if source not in binds:
        raise InvalidArgument("binds", f"needs a host folder for {source} ({service})")
    return f"{binds[source]}:{rest}"


def dependencies(service: Mapping[str, Any]) -> dict[str, str]:
    """`depends_on` as name -> condition, in either of compose's two spellings."""
    raw = service.get("depends_on") or {}
    if isinstance(raw, list):
        return {name: "service_started" for name in raw}
    out = {}
    for name, spec in raw.items():
        condition = (spec or {}).get("condition", "service_started")
        if condition not in CONDITIONS:
            raise InvalidArgument(
                f"depends_on.{name}.condition", f"one of {', '.join(CONDITIONS)}, got {condition!r}"
            )
        out[name] = condition
    return out


def start_order(services: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every service after those it depends on; ties keep the file's order.

    Example: {"a": {depends_on: [b]}, "b": {}, "c": {}} -> ["b", "a", "c"]
    """
    needs = {name: set(dependencies(s)) for name, s in services.items()}
    unknown = sorted(f"{name} -> {d}" for name, ds in needs.items() for d in ds if d not in services)
    if unknown:
        raise InvalidArgument("depends_on", f"names services that do not exist: {', '.join(unknown)}")
    order: list[str] = []
    while len(order) < len(needs):
        ready = [n for n in needs if n not in order and needs[n] <= set(order)]
        if not ready:
            stuck = sorted(n for n in needs if n not in order)
            raise InvalidArgument("depends_on", f"a cycle among {', '.join(stuck)}")
        order.append(ready[0])
    return order


def pip_paths(settings: Sequence[tuple[str, str]]) -> list[str]:
    """The local paths pip's configuration names (`pip config list` as key, value pairs), for the
    build to see them where pip looks: find-links folders, constraint and certificate files, and
    local indexes (a `file://.../simple` index's files sit beside its `simple/`, so its parent).

    Example: [("global.find-links", "/opt/wheels"), ("global.extra-index-url",
    "file:///opt/pypi/simple https://example.org/simple")] -> ["/opt/pypi", "/opt/wheels"]
    """
    paths: set[str] = set()
    for key, value in settings:
        option = key.rsplit(".", 1)[-1]
        if option not in ("find-links", "index-url", "extra-index-url", "constraint", "requirement", "cert"):
            continue
        for word in value.split():
            if word.startswith("file://"):
                path = PurePosixPath(unquote(urlparse(word).path))
            elif word.startswith("/"):
                path = PurePosixPath(word)
            else:
                continue  # a remote index: reached over the network as configured
            paths.add(str(path.parent if option.endswith("index-url") and path.name == "simple" else path))
    return sorted(paths)


def parse_pip_config(listing: str) -> list[tuple[str, str]]:
    """`pip config list` output to key, value pairs. Example: "global.cert='/a'" -> [("global.cert", "/a")]"""
    pairs = []
    for line in listing.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            pairs.append((key.strip(), value.strip().strip("'\"")))
    return pairs
