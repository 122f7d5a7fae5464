"""The pod a Kubernetes sandbox runs in, and the kubectl command lines that drive it (pure).

A container task on a cluster runs in a pod of the task's own image under the RuntimeClass of
deploy/k8s/base/harness-runtimeclass.yaml (`gyre-sandbox`: gVisor or Kata, so the harness's
syscalls never reach the node's kernel). The guarantees of the local backends, in a pod's terms:

- no network but the proxy: the pod carries the labels the NetworkPolicy `gyre-harness-egress`
  selects (egress to the proxy's port 8080 and DNS only), no service account token, no service
  links;
- no host root: `hostUsers: false` (a user namespace per pod, Kubernetes 1.30+); the harness runs
  as AGENT_UID (`setpriv` in front of its command), the pod's root keeps only SETUP_CAPS, no
  privilege escalation, the runtime's default seccomp profile;
- limits: cpu, memory and ephemeral-storage limits equal to the requests (the kubelet evicts a
  pod past its storage: the cap the local engines lack); pids by the kubelet's podPidsLimit.

Example:
    manifest = pod_manifest(name="gyre-run-x", image="swebench/sweb.eval.x86_64.a:latest",
                            limits=ContainerLimits(cpus=2, memory_mb=4096), owner="runner-1")
    argv = exec_argv(["kubectl"], "gyre-run-x", ["pytest"], workdir="/testbed", user="61000:61000")
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci_policy import SETUP_CAPS

RUNTIME_CLASS = "gyre-sandbox"
"""deploy/k8s/base/harness-runtimeclass.yaml."""
CONTAINER = "box"
HARNESS_LABELS = {"app.kubernetes.io/name": "gyre", "app.kubernetes.io/component": "harness"}
"""What deploy/k8s/base/harness-networkpolicy.yaml selects: egress to the proxy and DNS only."""
OWNER_LABEL = "gyre.dev/owner"
NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def owner_value(owner: str) -> str:
    """A label value for any owner string (label values are at most 63 characters of a small
    alphabet): a digest of it. Example: owner_value("runner:/var/gyre") -> "o-3f2a..." (18)."""
    return "o-" + hashlib.sha256(owner.encode()).hexdigest()[:16]


def pod_manifest(
    *,
    name: str,
    image: str,
    limits: ContainerLimits,
    owner: str = "",
    runtime_class: str = RUNTIME_CLASS,
    deadline_s: int | None = None,
) -> dict[str, Any]:
    """The Pod object (a dict for `kubectl create -f -`); ValueError for a name a pod cannot have."""
    if not NAME.match(name):
        raise ValueError(f"pod name {name!r} must be a DNS label: lower case, digits, '-', at most 63")
    limits.validate()
    amounts = {
        "cpu": f"{round(limits.cpus * 1000)}m",
        "memory": f"{limits.memory_mb}Mi",
        "ephemeral-storage": f"{limits.storage_mb}Mi",
    }
    spec: dict[str, Any] = {
        "runtimeClassName": runtime_class,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostUsers": False,
        "terminationGracePeriodSeconds": 0,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": CONTAINER,
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "infinity"],
                "resources": {"requests": dict(amounts), "limits": dict(amounts)},
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "privileged": False,
                    "capabilities": {"drop": ["ALL"], "add": list(SETUP_CAPS)},
                },
            }
        ],
    }
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = int(deadline_s)
    labels = dict(HARNESS_LABELS) | {"gyre.dev/sandbox": "1"}
    if owner:
        labels[OWNER_LABEL] = owner_value(owner)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def exec_argv(
    kubectl: Sequence[str],
    pod: str,
    argv: Sequence[str],
    *,
    workdir: str = "",
    env: Mapping[str, str] | None = None,
    user: str = "",
    stdin: bool = False,
) -> list[str]:
    """`kubectl exec` has no --workdir, --env or --user: a shell changes folder, `env` sets the
    variables and `setpriv` (util-linux, in Debian's and Ubuntu's images) becomes `user`
    ("uid:gid") with no supplementary groups. Example:
        exec_argv(["kubectl"], "p", ["ls"], workdir="/w", user="61000:61000")
        -> ["kubectl", "exec", "p", "-c", "box", "--", "sh", "-c", 'cd "$1" && shift && exec "$@"',
            "sh", "/w", "setpriv", "--reuid", "61000", "--regid", "61000", "--clear-groups", "--", "ls"]
    """
    command = list(argv)
    if user:
        uid, _, gid = user.partition(":")
        command = ["setpriv", "--reuid", uid, "--regid", gid or uid, "--clear-groups", "--", *command]
    if env:
        command = ["env", *(f"{k}={v}" for k, v in env.items()), *command]
    if workdir:
        command = ["sh", "-c", 'cd "$1" && shift && exec "$@"', "sh", workdir, *command]
    return [*kubectl, "exec", *(["-i"] if stdin else []), pod, "-c", CONTAINER, "--", *command]
