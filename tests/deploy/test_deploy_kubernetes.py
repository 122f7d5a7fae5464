"""deploy/k8s: kustomize builds every overlay, the schemas accept it, and it hangs together.

`kubectl kustomize` and `kubernetes-validate --strict` are the real tools (dev extra). The
cross-checks read the YAML as written (base plus the cpu overlay's own resources): every service
runs in a workload with gRPC probes on its port, every Service selects pods that expose its
target ports, the harness Job's NetworkPolicy admits exactly the proxy pods on the proxy's HTTP
port, every address a container is told is a Service with that port, and every GYRE_* variable
is a setting some service reads.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_files import (
    ADDRESS,
    K8S,
    flag,
    kubectl,
    kubernetes_validate,
    load_kustomization,
    run_tool,
    service_module,
    unknown_gyre_variables,
)

from gyre_app.stack import SERVICES

OVERLAYS = ("cpu", "gpu")
WORKLOADS = ("Deployment", "StatefulSet", "Job")
PLACEHOLDER = re.compile(r"\$\{[A-Z_]+\}")
HARNESS_FIELDS = {"EXECUTION_ID": "0190f7a2", "TIMEOUT_S": "3600", "WORKSPACE_TEMPLATE": "task:slugfix"}


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return load_kustomization(K8S / "overlays" / "cpu")


def harness_job() -> list[dict[str, Any]]:
    """The harness Job template filled as a launcher would fill it."""
    text = (K8S / "harness-job.yaml").read_text()
    for name, value in HARNESS_FIELDS.items():
        text = text.replace("${" + name + "}", value)
    assert PLACEHOLDER.search(text) is None, "a placeholder the test does not fill"
    return [d for d in yaml.safe_load_all(text) if d]


def named(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = workload["spec"]["template"]["spec"]
    return spec


def containers(docs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    return [(w, c) for w in docs if w["kind"] in WORKLOADS for c in pod_spec(w)["containers"]]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def exposed_ports(docs: list[dict[str, Any]], selector: dict[str, str]) -> dict[str, int]:
    """Container ports (by name and by number) of every pod the selector matches."""
    ports: dict[str, int] = {}
    for workload, container in containers(docs):
        if selects(selector, workload["spec"]["template"]["metadata"]["labels"]):
            for port in container.get("ports", []):
                ports[port.get("name", str(port["containerPort"]))] = port["containerPort"]
                ports[str(port["containerPort"])] = port["containerPort"]
    return ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kustomize_builds_the_overlay_and_the_schemas_accept_it(overlay: str, tmp_path: Path) -> None:
    built = run_tool([kubectl(), "kustomize", str(K8S / "overlays" / overlay)])
    assert built.returncode == 0, built.stderr
    path = tmp_path / f"{overlay}.yaml"
    path.write_text(built.stdout)
    checked = run_tool([kubernetes_validate(), "--strict", "--quiet", str(path)])
    assert checked.returncode == 0, checked.stdout + checked.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(built.stdout) if d}
    assert {"Deployment", "StatefulSet", "Service", "Job", "NetworkPolicy"} <= kinds


def test_the_filled_harness_job_passes_the_schemas(tmp_path: Path) -> None:
    path = tmp_path / "harness.yaml"
    path.write_text(yaml.safe_dump_all(harness_job()))
    checked = run_tool([kubernetes_validate(), "--strict", "--quiet", str(path)])
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_schema_validator_refuses_an_unknown_field(tmp_path: Path) -> None:
    """The validator has teeth: a misspelt field in a Deployment is an error."""
    deployment = named(load_kustomization(K8S / "base"), "Deployment")["gyre-scheduler"]
    pod_spec(deployment)["containers"][0]["readinesProbe"] = pod_spec(deployment)["containers"][0][
        "readinessProbe"
    ]
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    checked = run_tool([kubernetes_validate(), "--strict", "--quiet", str(path)])
    assert checked.returncode != 0
    assert "readinesProbe" in checked.stdout + checked.stderr


def test_every_service_runs_in_a_workload_with_grpc_probes_on_its_port(docs: list[dict[str, Any]]) -> None:
    """The probes run `gyre.healthcheck` in the container: the kubelet's own gRPC probe speaks no
    TLS, and every service asks its clients for a certificate."""
    found = {}
    for _, container in containers(docs):
        module = service_module(container.get("command", []))
        if module is not None:
            found[module] = container
    # Engines and cell agents run in the cell pods; the core cell's agent beside the trainer.
    assert set(found) == {f"services.{name}" for name in SERVICES} | {"services.engine", "services.cell"}
    for module, container in found.items():
        port = int(flag(container["command"], "--port"))
        check = ["python", "-m", "gyre.healthcheck", f"127.0.0.1:{port}"]
        assert container["readinessProbe"]["exec"]["command"] == check, module
        assert container["livenessProbe"]["exec"]["command"] == check, module


def test_services_talk_mutual_tls_and_the_servers_ask_for_passwords_by_default(
    docs: list[dict[str, Any]],
) -> None:
    config = named(docs, "ConfigMap")["gyre-config"]["data"]
    assert config["GYRE_TLS_CA_FILE"] == "/etc/gyre/secrets/ca.pem"
    assert config["GYRE_NATS_PASSWORD_FILE"] == "/etc/gyre/secrets/nats.password"
    assert config["GYRE_DATABASE_PASSWORD_FILE"] == "/etc/gyre/secrets/postgres.password"
    checked = 0
    for workload, container in containers(docs):
        if not any(
            ref.get("configMapRef", {}).get("name") == "gyre-config" for ref in container.get("envFrom", [])
        ):
            continue
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod_spec(workload).get("volumes", [])}
        assert mounts.get("secrets") == "/etc/gyre/secrets", container["name"]
        assert volumes["secrets"]["secret"]["secretName"] == "gyre-secrets", container["name"]
        if service_module(container.get("command", [])) is not None:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            assert env["GYRE_TLS_CERT_FILE"].startswith("/etc/gyre/secrets/"), container["name"]
            assert env["GYRE_TLS_KEY_FILE"] == env["GYRE_TLS_CERT_FILE"].replace(".pem", ".key")
            checked += 1
    assert checked == len(SERVICES) + 3  # every service, the cells' engine and agent, the core's agent


def test_the_migrations_job_runs_gyre_migrate(docs: list[dict[str, Any]]) -> None:
    job = named(docs, "Job")["gyre-migrate"]
    assert pod_spec(job)["containers"][0]["command"] == ["gyre", "migrate"]


def test_every_service_selects_pods_that_expose_its_target_ports(docs: list[dict[str, Any]]) -> None:
    problems = []
    for name, service in named(docs, "Service").items():
        exposed = exposed_ports(docs, service["spec"]["selector"])
        for port in service["spec"]["ports"]:
            if str(port["targetPort"]) not in exposed:
                problems.append(f"{name}: no selected pod exposes {port['targetPort']}")
    assert problems == []


def test_the_harness_policy_admits_the_proxy_pods_on_the_proxy_http_port(docs: list[dict[str, Any]]) -> None:
    policy = named(docs, "NetworkPolicy")["gyre-harness-egress"]
    job_labels = harness_job()[0]["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"]["matchLabels"], job_labels)
    proxy_rule = policy["spec"]["egress"][0]
    proxy_pods = proxy_rule["to"][0]["podSelector"]["matchLabels"]
    proxy_service = named(docs, "Service")["gyre-proxy"]
    assert proxy_pods == proxy_service["spec"]["selector"]
    http = next(p for p in proxy_service["spec"]["ports"] if p["name"] == "http")
    assert [p["port"] for p in proxy_rule["ports"]] == [exposed_ports(docs, proxy_pods)[http["targetPort"]]]


def test_every_address_a_container_is_told_is_a_service_with_that_port(docs: list[dict[str, Any]]) -> None:
    """`gyre-proxy:50053`, `http://gyre-proxy:8080/v1`, `gyre-cell-0.gyre-cell:50052`, `nats://nats:4222`."""
    ports = {name: {p["port"] for p in s["spec"]["ports"]} for name, s in named(docs, "Service").items()}
    values = [
        e["value"] for _, c in containers(docs + harness_job()) for e in c.get("env", []) if "value" in e
    ]
    values += list(named(docs, "ConfigMap")["gyre-config"]["data"].values())
    values += [a for _, c in containers(docs) for a in c.get("command", []) if ADDRESS.match(a)]
    problems = []
    for value in values:
        # `$(POD_NAME).gyre-cell:50052`: Kubernetes expands the pod's name; the Service is second.
        match = ADDRESS.match(str(value).replace("$(POD_NAME)", "gyre-cell-0"))
        if match is None:
            continue
        host, port = match.group(1).split("."), int(match.group(2))
        service = host[1] if len(host) > 1 else host[0]  # pod.headless-service: the Service is second
        if port not in ports.get(service, set()):
            problems.append(f"{value}: no Service {service} with port {port}")
    assert problems == []


def test_every_gyre_variable_is_a_setting_some_service_reads(docs: list[dict[str, Any]]) -> None:
    names = [e["name"] for _, c in containers(docs) for e in c.get("env", [])]
    names += list(named(docs, "ConfigMap")["gyre-config"]["data"])
    for overlay in OVERLAYS:
        kustomization = (K8S / "overlays" / overlay / "kustomization.yaml").read_text()
        names += [
            word.strip("\"'{},:").split("=")[0] for word in kustomization.split() if word.startswith("GYRE_")
        ]
    assert unknown_gyre_variables(names) == []


def test_the_harness_job_runs_under_a_runtime_class_the_base_defines() -> None:
    job = harness_job()[0]
    runtime_classes = named(load_kustomization(K8S / "base"), "RuntimeClass")
    assert pod_spec(job)["runtimeClassName"] in runtime_classes


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_cell_pod_runs_its_agent_beside_its_engine_and_the_core_agent_beside_the_trainer(
    overlay: str,
) -> None:
    built = load_kustomization(K8S / "overlays" / overlay)
    by_name = {
        (w["metadata"]["name"], c["name"]): {e["name"]: e.get("value") for e in c.get("env", [])}
        for w, c in containers(built)
    }
    engine, agent = by_name[("gyre-cell", "engine")], by_name[("gyre-cell", "agent")]
    # The same cell id (the pod's name) for both, and the engine the agent registers is this pod's.
    assert engine["GYRE_ENGINE_CELL_ID"] is None and agent["GYRE_CELL_CELL_ID"] == "$(POD_NAME)"
    assert agent["GYRE_CELL_ENGINE_ADDRESS"] == "$(POD_NAME).gyre-cell:50052"
    agent_port = flag(
        next(c for w, c in containers(built) if (w["metadata"]["name"], c["name"]) == ("gyre-cell", "agent"))[
            "command"
        ],
        "--port",
    )
    assert agent["GYRE_CELL_ADVERTISE_ADDRESS"] == f"$(POD_NAME).gyre-cell:{agent_port}"
    core = by_name[("gyre-trainer", "agent")]
    trainer = by_name[("gyre-trainer", "trainer")]
    assert core["GYRE_CELL_CORE"] == "true" and core["GYRE_CELL_CELL_ID"] == trainer["GYRE_TRAINER_CELL_ID"]
    assert core["GYRE_CELL_TRAINER_ADDRESS"] == "gyre-trainer:50057"
    assert not any(w["metadata"]["name"].startswith("gyre-register") for w in built)
