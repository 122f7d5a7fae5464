"""deploy/docker-compose.yml: valid for Docker Compose itself, and consistent with the services.

`docker compose config` is the real check (the compose plugin from the dev extra; no Docker
engine is needed to validate). The cross-checks below read the file as YAML: every service of
the local stack runs from the one image with a health check on its own port, every address a
service is told names a compose service listening there which it waits for, and every GYRE_*
variable is a setting some service reads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import (
    ADDRESS,
    DEPLOY,
    docker_compose,
    flag,
    service_module,
    unknown_gyre_variables,
)

from gyre_app.stack import NEEDS_MODEL, SERVICES

COMPOSE_FILE = DEPLOY / "docker-compose.yml"
INFRASTRUCTURE_PORTS = {"nats": 4222, "postgres": 5432}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return loaded["services"]


def grpc_port(service: dict[str, Any]) -> int:
    return int(flag(service["command"], "--port"))


def test_docker_compose_config_accepts_the_file(tmp_path: Path) -> None:
    result = docker_compose(["-f", str(COMPOSE_FILE), "config", "--format", "json"], tmp_path)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)["services"]
    assert set(SERVICES) <= set(resolved)


def test_docker_compose_config_refuses_a_broken_file(tmp_path: Path) -> None:
    """The validator has teeth: a dependency on a service that does not exist is an error."""
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["scheduler"]["depends_on"]["vanished"] = {"condition": "service_healthy"}
    path = tmp_path / "broken.yml"
    path.write_text(yaml.safe_dump(broken))
    result = docker_compose(["-f", str(path), "config", "-q"], tmp_path)
    assert result.returncode != 0
    assert "vanished" in result.stderr


def test_every_service_runs_from_the_one_image(compose: dict[str, Any]) -> None:
    for name in SERVICES:
        service = compose[name]
        assert service_module(service["command"]) == f"services.{name}"
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert service["image"] == "gyre:latest"


def test_every_service_has_a_grpc_health_check_on_its_own_port(compose: dict[str, Any]) -> None:
    for name in SERVICES:
        test = compose[name]["healthcheck"]["test"]
        assert test[:4] == ["CMD", "python", "-m", "gyre.healthcheck"], name
        assert test[4] == f"127.0.0.1:{grpc_port(compose[name])}", name


def test_migrations_run_before_every_service_that_owns_tables(compose: dict[str, Any]) -> None:
    assert compose["migrate"]["command"] == ["gyre", "migrate"]
    assert compose["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in SERVICES:
        if name == "engine":  # owns no tables
            continue
        assert compose[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully", name


def test_services_that_load_the_model_wait_for_the_engine(compose: dict[str, Any]) -> None:
    for name in NEEDS_MODEL:
        assert compose[name]["depends_on"]["engine"]["condition"] == "service_healthy", name


def waits_for(compose: dict[str, Any], name: str) -> set[str]:
    """Every service `name` starts after, directly or through its dependencies."""
    seen: set[str] = set()
    todo = list(compose[name].get("depends_on") or {})
    while todo:
        dependency = todo.pop()
        if dependency not in seen:
            seen.add(dependency)
            todo += list(compose[dependency].get("depends_on") or {})
    return seen


def test_every_address_a_service_is_told_is_a_service_it_waits_for(compose: dict[str, Any]) -> None:
    """`proxy:50053`, `http://proxy:8080`, `nats://nats:4222`: that service, that port, started
    before it (directly, or as the migrations job's database)."""
    listening = {name: {grpc_port(s)} for name, s in compose.items() if service_module(s.get("command", []))}
    listening["proxy"].add(int(compose["proxy"]["environment"]["GYRE_PROXY_HTTP_PORT"]))
    for name, port in INFRASTRUCTURE_PORTS.items():
        listening[name] = {port}
    problems = []
    for name, service in compose.items():
        for variable, value in (service.get("environment") or {}).items():
            match = ADDRESS.match(str(value))
            if match is None:
                continue
            host, port = match.group(1), int(match.group(2))
            if port not in listening.get(host, set()):
                problems.append(f"{name}: {variable}={value} but {host} does not listen on {port}")
            elif host != name and host not in waits_for(compose, name):  # its own name: how others reach it
                problems.append(f"{name}: {variable} names {host}, which it does not wait for")
    assert problems == []


def test_every_gyre_variable_is_a_setting_some_service_reads(compose: dict[str, Any]) -> None:
    names = [v for s in compose.values() for v in (s.get("environment") or {})]
    assert unknown_gyre_variables(names) == []


def test_each_cell_has_an_agent_that_registers_it_once_what_it_names_serves(compose: dict[str, Any]) -> None:
    """The core cell's agent stands for the trainer; the satellite's for the engine, on the cell
    id the engine reports; the scheduler routes the proxy to it (no registration job)."""
    core, satellite = compose["cell-0"], compose["cell-1"]
    for agent in (core, satellite):
        assert service_module(agent["command"]) == "services.cell"
        assert agent["healthcheck"]["test"][4] == f"127.0.0.1:{grpc_port(agent)}"
    assert core["environment"]["GYRE_CELL_CORE"] == "true"
    assert (
        core["environment"]["GYRE_CELL_CELL_ID"] == compose["trainer"]["environment"]["GYRE_TRAINER_CELL_ID"]
    )
    assert (
        satellite["environment"]["GYRE_CELL_CELL_ID"]
        == compose["engine"]["environment"]["GYRE_ENGINE_CELL_ID"]
    )
    assert satellite["environment"]["GYRE_CELL_ADVERTISE_ADDRESS"] == f"cell-1:{grpc_port(satellite)}"
    assert compose["scheduler"]["environment"]["GYRE_SCHEDULER_PROXY_ADDRESS"] == "proxy:50053"
    assert not any(name.startswith("register") for name in compose)


def test_the_image_holds_every_package_and_installs_it_in_place() -> None:
    """A package the project ships but the image lacks breaks `gyre migrate` or a service at
    start; an install that is not editable leaves the migrations folders behind."""
    import tomllib

    dockerfile = (DEPLOY / "Dockerfile").read_text().splitlines()
    copied = {line.split()[1] for line in dockerfile if line.startswith("COPY ")}
    project = tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= copied
    assert any(line.strip().startswith("&& pip install") and " -e ." in line for line in dockerfile)


def test_the_image_carries_the_real_harnesses_at_the_tested_versions() -> None:
    """The runner starts `claude` and `mini` from the image's PATH; the versions are the ones the
    tests run (tests/harness_install.py, the dev extra's pin)."""
    from harness_install import CLAUDE_CODE_VERSION  # tests/ is on the path (its conftest.py)

    dockerfile = (DEPLOY / "Dockerfile").read_text()
    pyproject = (DEPLOY.parent / "pyproject.toml").read_text()
    assert f"ARG CLAUDE_CODE_VERSION={CLAUDE_CODE_VERSION}" in dockerfile
    assert "nodejs npm" in dockerfile
    assert 'npm install -g --no-audit --no-fund "@anthropic-ai/claude-code@' in dockerfile
    pin = pyproject.split('"mini-swe-agent==', 1)[1].split('"', 1)[0]
    assert f"ARG MINI_SWE_AGENT_VERSION={pin}" in dockerfile
    assert "ln -s /usr/local/lib/mini-swe-agent/bin/mini /usr/local/bin/mini" in dockerfile


def test_services_talk_mutual_tls_and_the_servers_ask_for_passwords_by_default(
    compose: dict[str, Any],
) -> None:
    grpc_clients = [
        n for n, s in compose.items() if service_module(s.get("command") or []) or n == "register-engine"
    ]
    assert len(grpc_clients) >= 8
    for name in grpc_clients:
        env = compose[name]["environment"]
        assert env["GYRE_TLS_CA_FILE"] == "/secrets/ca.pem", name
        assert env["GYRE_TLS_CERT_FILE"] == f"/secrets/{name}.pem", name
        assert env["GYRE_TLS_KEY_FILE"] == f"/secrets/{name}.key", name
        assert any(v.startswith("secrets:/secrets") for v in compose[name]["volumes"]), name
        if "GYRE_NATS_URL" in env:
            assert env["GYRE_NATS_PASSWORD_FILE"] == "/secrets/nats.password", name
        if "GYRE_DATABASE_URL" in env:
            assert env["GYRE_DATABASE_PASSWORD_FILE"] == "/secrets/postgres.password", name
    made = compose["certs"]["command"][-1]
    assert all(f"--name {n}" in made for n in grpc_clients)
    assert "/secrets/nats-auth.conf" in compose["nats"]["command"]
    postgres = compose["postgres"]["environment"]
    assert "POSTGRES_HOST_AUTH_METHOD" not in postgres and postgres["POSTGRES_PASSWORD_FILE"]
