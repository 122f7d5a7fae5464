"""Sandboxes as Kubernetes pods of the task's image (shell: the kubectl CLI against a cluster).

The same interface as the local engine's (`gyre.sandbox.backend`: create, exec, upload,
download, close, limits, alive); the pod itself is `k8s_pod.pod_manifest`. The harness reaches
the proxy over the pod network (the NetworkPolicy lets it reach nothing else), so there is no
forwarder socket and no relay: `forward_folder` is refused. Images come from the cluster's
registry: `image_present` cannot see it and answers True; a pull that fails ends `create` with
the pod's reason.

Not run here: this machine has no cluster and no API server (no envtest or kwok binaries are to
be had offline), so only the pod and the command lines are tested (tests/test_k8s_pod.py).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Sequence

from gyre.errors import InvalidArgument, Unavailable
from gyre.sandbox.backend import ContainerLimits, ExecResult
from gyre.sandbox.k8s_pod import CONTAINER, RUNTIME_CLASS, exec_argv, pod_manifest
from gyre.sandbox.oci import _q, _run

START_TIMEOUT_S = 300.0
"""Scheduling, pulling the image and starting: a large SWE-bench image pulls for minutes."""


class KubernetesBackend:
    """Pods in one namespace of the cluster `kubectl` is configured for (its kubeconfig, or the
    runner pod's service account)."""

    def __init__(self, *, namespace: str = "", kubectl: Sequence[str] | None = None, runtime_class: str = ""):
        found = list(kubectl) if kubectl is not None else ([shutil.which("kubectl") or ""])
        if not found or not found[0]:
            raise Unavailable("no kubectl: the Kubernetes backend drives the cluster through it")
        self.kubectl = [*found, *(["--namespace", namespace] if namespace else [])]
        self.runtime_class = runtime_class

    async def image_present(self, image: str) -> bool:
        return bool(image)  # the cluster's registry: only a pull can tell

    async def create(
        self,
        *,
        name: str,
        image: str,
        limits: ContainerLimits,
        forward_folder: str = "",
        listen_port: int = 18080,
        owner: str = "",
    ) -> Pod:
        if forward_folder:
            raise InvalidArgument(
                "forward_folder", "a pod reaches the proxy over the pod network, not a socket"
            )
        manifest = pod_manifest(
            name=name,
            image=image,
            limits=limits,
            owner=owner,
            runtime_class=self.runtime_class or RUNTIME_CLASS,
        )
        code, _, err = await _run([*self.kubectl, "create", "-f", "-"], stdin=json.dumps(manifest).encode())
        if code != 0:
            raise Unavailable(f"pod {name} was not created: {err.decode(errors='replace')[-600:]}")
        pod = Pod(name=name, kubectl=self.kubectl, limits=limits)
        ready = [
            *self.kubectl,
            "wait",
            "--for=condition=Ready",
            f"pod/{name}",
            f"--timeout={START_TIMEOUT_S:g}s",
        ]
        code, _, err = await _run(ready, timeout_s=START_TIMEOUT_S + 30)
        if code != 0:
            why = await pod.waiting_reason()
            await pod.close()
            raise Unavailable(
                f"pod {name} of {image!r} did not start: {why or err.decode(errors='replace')[-600:]}"
            )
        return pod


class Pod:
    """One running pod; every method is safe to call after `close` (it does nothing)."""

    def __init__(self, *, name: str, kubectl: list[str], limits: ContainerLimits):
        self.name = name
        self.kubectl = kubectl
        self.limits = limits
        self.closed = False

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout_s: float,
        workdir: str = "",
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        max_output: int = 8 << 20,
        user: str = "",
    ) -> ExecResult:
        """Past `timeout_s` the pod is deleted (nothing outlives its deadline). A pod evicted for
        its ephemeral storage answers `storage_exceeded`."""
        cmd = exec_argv(
            self.kubectl, self.name, argv, workdir=workdir, env=env, user=user, stdin=stdin is not None
        )
        try:
            code, out, err = await _run(cmd, stdin=stdin, timeout_s=max(0.1, timeout_s))
        except Unavailable:
            await self.close()
            return ExecResult(exit_code=None, output=b"", timed_out=True)
        output = out + err
        evicted = code != 0 and "Evicted" in await self.phase_reason()
        return ExecResult(
            exit_code=code,
            output=output[:max_output],
            truncated=len(output) > max_output,
            storage_exceeded=evicted,
        )

    async def upload(self, source: str, dest: str) -> None:
        code, _, err = await _run([*self.kubectl, "cp", "-c", CONTAINER, source, f"{self.name}:{dest}"])
        if code != 0:
            raise Unavailable(
                f"upload of {source} to {self.name}:{dest} failed: {err.decode(errors='replace')[-400:]}"
            )

    async def download(self, path: str, *, max_bytes: int = 64 << 20) -> bytes | None:
        script = f"test -f {_q(path)} || exit 3; head -c {max_bytes} {_q(path)}"
        result = await self.exec(["sh", "-c", script], timeout_s=120, max_output=max_bytes)
        if result.exit_code == 3:
            return None
        if result.exit_code != 0:
            raise Unavailable(f"download of {path} from {self.name} failed: {result.output[-400:]!r}")
        return result.output

    async def alive(self) -> bool:
        if self.closed:
            return False
        code, out, _ = await _run([*self.kubectl, "get", "pod", self.name, "-o", "jsonpath={.status.phase}"])
        return code == 0 and out.strip() == b"Running"

    async def phase_reason(self) -> str:
        code, out, _ = await _run([*self.kubectl, "get", "pod", self.name, "-o", "jsonpath={.status.reason}"])
        return out.decode(errors="replace") if code == 0 else ""

    async def waiting_reason(self) -> str:
        """Why the container is not running (ErrImagePull, Unschedulable ...), as the pod says."""
        path = "jsonpath={.status.containerStatuses[0].state.waiting.reason}: {.status.conditions[*].message}"
        with contextlib.suppress(Unavailable):
            code, out, _ = await _run([*self.kubectl, "get", "pod", self.name, "-o", path])
            if code == 0:
                return out.decode(errors="replace").strip(": ")
        return ""

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Unavailable):
            await _run(
                [
                    *self.kubectl,
                    "delete",
                    "pod",
                    self.name,
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                    "--ignore-not-found",
                ]
            )
