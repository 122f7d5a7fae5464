"""The compose smoke run's plan (pure): the run file it derives from deploy/docker-compose.yml, the
order it starts services in, the pip paths its image build mounts, what the build copies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import DEPLOY

from gyre.errors import InvalidArgument
from gyre_app.compose_images import copied_sources, tree_hash
from gyre_app.compose_plan import (
    LIMITS,
    PUBLISHED,
    Images,
    dependencies,
    parse_pip_config,
    pip_paths,
    smoke_compose,
    start_order,
)

IMAGES = Images(gyre="localhost/gyre-compose:abc", nats="localhost/n:1", postgres="localhost/p:1")
PORTS = {name: 41000 + i for i, name in enumerate(PUBLISHED)}
BINDS = {"./sandboxes": "/tmp/run/sandboxes"}


@pytest.fixture(scope="module")
def deploy() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    return loaded


def test_the_run_file_uses_the_local_images_and_publishes_only_what_the_demo_reaches(
    deploy: dict[str, Any],
) -> None:
    plan = smoke_compose(deploy, IMAGES, PORTS, BINDS)["services"]
    assert plan["nats"]["image"] == IMAGES.nats and plan["postgres"]["image"] == IMAGES.postgres
    assert all(s["image"] == IMAGES.gyre for n, s in plan.items() if n not in ("nats", "postgres"))
    assert not any("build" in s for s in plan.values())
    published = {n: s["ports"] for n, s in plan.items() if "ports" in s}
    assert published == {
        "nats": [f"127.0.0.1:{PORTS['nats']}:4222"],
        "scheduler": [f"127.0.0.1:{PORTS['scheduler']}:50051"],
        "trajectory": [f"127.0.0.1:{PORTS['trajectory']}:50055"],
        "engine": [f"127.0.0.1:{PORTS['engine']}:50052"],
    }  # the machine's own Postgres (5432) and NATS (4222) keep their ports
    assert all(s["ulimits"] == LIMITS for s in plan.values())


def test_the_run_file_keeps_the_deploy_files_commands_environment_and_health_checks(
    deploy: dict[str, Any],
) -> None:
    plan = smoke_compose(deploy, IMAGES, PORTS, BINDS)["services"]
    for name, service in deploy["services"].items():
        for key in ("command", "environment", "healthcheck", "depends_on"):
            assert plan[name].get(key) == service.get(key), (name, key)
    assert "ports" in deploy["services"]["postgres"]  # the input is not changed


def test_the_sandboxes_folder_is_one_host_folder_with_shared_propagation_in_runner_and_evaluator(
    deploy: dict[str, Any],
) -> None:
    """The runner mounts each workspace as a tmpfs; the evaluator grades it by its path, so the
    mount must reach the evaluator's container: a bind mount with shared propagation."""
    plan = smoke_compose(deploy, IMAGES, PORTS, BINDS)["services"]
    for name in ("runner", "evaluator"):
        assert "./sandboxes:/var/lib/gyre/sandboxes:rshared" in deploy["services"][name]["volumes"]
        assert "/tmp/run/sandboxes:/var/lib/gyre/sandboxes:rshared" in plan[name]["volumes"]
        assert "secrets:/secrets:ro" in plan[name]["volumes"]
    with pytest.raises(InvalidArgument, match=r"\./sandboxes"):
        smoke_compose(deploy, IMAGES, PORTS, {})


def test_a_missing_port_is_refused_naming_it(deploy: dict[str, Any]) -> None:
    with pytest.raises(InvalidArgument, match="engine"):
        smoke_compose(deploy, IMAGES, {k: v for k, v in PORTS.items() if k != "engine"}, BINDS)


def test_services_start_after_what_they_depend_on(deploy: dict[str, Any]) -> None:
    order = start_order(deploy["services"])
    assert sorted(order) == sorted(deploy["services"])
    for name, service in deploy["services"].items():
        for dependency in dependencies(service):
            assert order.index(dependency) < order.index(name), (dependency, name)
    assert order[0] == "certs"


def test_start_order_keeps_the_files_order_and_refuses_cycles_and_unknown_names() -> None:
    assert start_order({"a": {"depends_on": ["b"]}, "b": {}, "c": {}}) == ["b", "a", "c"]
    with pytest.raises(InvalidArgument, match="cycle among a, b"):
        start_order({"a": {"depends_on": ["b"]}, "b": {"depends_on": ["a"]}})
    with pytest.raises(InvalidArgument, match="a -> gone"):
        start_order({"a": {"depends_on": {"gone": {"condition": "service_healthy"}}}})
    with pytest.raises(InvalidArgument, match="condition"):
        dependencies({"depends_on": {"b": {"condition": "service_happy"}}})


def test_pip_paths_are_the_local_places_the_configuration_names() -> None:
    listing = (
        "global.cert='/etc/ssl/certs/ca.crt'\n"
        "global.extra-index-url='file:///opt/pypi/simple https://example.org/simple'\n"
        "global.find-links='/opt/wheels'\n"
        ":env:.find-links='/opt/wheels'\n"
        "global.timeout='60'\n"
    )
    assert pip_paths(parse_pip_config(listing)) == ["/etc/ssl/certs/ca.crt", "/opt/pypi", "/opt/wheels"]


def test_the_build_copies_what_the_dockerfile_copies_and_its_hash_follows_the_files(tmp_path: Path) -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert copied_sources(dockerfile) == [
        "pyproject.toml",
        "README.md",
        "gyre",
        "gyre_app",
        "services",
        "bench",
    ]
    (tmp_path / "a").write_text("one")
    first = tree_hash(tmp_path, ["base-id"])
    assert tree_hash(tmp_path, ["base-id"]) == first
    assert tree_hash(tmp_path, ["other-base"]) != first
    (tmp_path / "a").write_text("two")
    assert tree_hash(tmp_path, ["base-id"]) != first
