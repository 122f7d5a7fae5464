"""The Kubernetes backend's pod and command lines (pure). No cluster runs here, so nothing in
this file starts a pod: it checks what the backend would ask a cluster for."""

from __future__ import annotations

import pytest

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.k8s_pod import (
    HARNESS_LABELS,
    OWNER_LABEL,
    RUNTIME_CLASS,
    exec_argv,
    owner_value,
    pod_manifest,
)
from gyre.sandbox.oci_policy import SETUP_CAPS


def test_the_pod_runs_the_tasks_image_under_the_runtime_class_confined_and_limited() -> None:
    limits = ContainerLimits(cpus=1.5, memory_mb=2048, storage_mb=4096)
    pod = pod_manifest(
        name="gyre-run-abc", image="swebench/sweb.eval.x86_64.a:latest", limits=limits, owner="r1"
    )
    spec = pod["spec"]
    assert pod["kind"] == "Pod" and pod["metadata"]["name"] == "gyre-run-abc"
    assert spec["runtimeClassName"] == RUNTIME_CLASS == "gyre-sandbox"
    assert spec["hostUsers"] is False and spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False and spec["restartPolicy"] == "Never"
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (box,) = spec["containers"]
    assert box["image"] == "swebench/sweb.eval.x86_64.a:latest"
    assert box["securityContext"]["allowPrivilegeEscalation"] is False
    assert box["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": list(SETUP_CAPS)}
    wanted = {"cpu": "1500m", "memory": "2048Mi", "ephemeral-storage": "4096Mi"}
    assert box["resources"] == {"requests": wanted, "limits": wanted}
    labels = pod["metadata"]["labels"]
    assert HARNESS_LABELS.items() <= labels.items()  # what the egress NetworkPolicy selects
    assert labels[OWNER_LABEL] == owner_value("r1") and len(owner_value("x" * 500)) <= 63


def test_the_runtime_class_matches_the_one_deploy_defines() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "deploy/k8s/base/harness-runtimeclass.yaml").read_text()
    assert f"name: {RUNTIME_CLASS}" in text


@pytest.mark.parametrize("name", ["Gyre_Run", "-x", "x" * 64, ""])
def test_a_name_no_pod_can_have_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="DNS label"):
        pod_manifest(name=name, image="i", limits=ContainerLimits())


def test_exec_changes_folder_sets_env_and_drops_to_the_user() -> None:
    argv = exec_argv(
        ["kubectl", "-n", "g"], "p", ["ls", "-a"], workdir="/w", env={"A": "1"}, user="61000:61000"
    )
    assert argv[:7] == ["kubectl", "-n", "g", "exec", "p", "-c", "box"]
    assert argv[7:13] == ["--", "sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", "/w"]
    assert argv[13:] == [
        "env",
        "A=1",
        "setpriv",
        "--reuid",
        "61000",
        "--regid",
        "61000",
        "--clear-groups",
        "--",
        "ls",
        "-a",
    ]
    assert exec_argv(["kubectl"], "p", ["true"], stdin=True) == [
        "kubectl",
        "exec",
        "-i",
        "p",
        "-c",
        "box",
        "--",
        "true",
    ]
