"""What a container may do: the seccomp profile and engine arguments (pure), and a live
container's agent user as the harness sees itself (Podman)."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from pathlib import Path

import pytest

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import OciBackend, find_engine
from gyre.sandbox.oci_policy import (
    AGENT_UID,
    CLONE_NAMESPACE_FLAGS,
    ENOSYS,
    USERNS_HOST_BASE,
    engine_security_args,
    seccomp_profile,
)
from gyre_app.images import DEFAULT_BASE, build_base

DEFAULT = {
    "defaultAction": "SCMP_ACT_ERRNO",
    "syscalls": [
        {"names": ["read", "unshare", "mount", "clone"], "action": "SCMP_ACT_ALLOW"},
        {"names": ["ptrace"], "action": "SCMP_ACT_ALLOW"},
    ],
}


def test_the_profile_drops_namespaces_mounts_and_ptrace_and_keeps_the_rest() -> None:
    profile = seccomp_profile(DEFAULT)
    allowed = {
        n
        for r in profile["syscalls"]
        if r["action"] == "SCMP_ACT_ALLOW" and "args" not in r
        for n in r["names"]
    }
    assert allowed == {"read"}  # unshare, mount and ptrace fall to the default action: refused
    (clone,) = [r for r in profile["syscalls"] if r["names"] == ["clone"]]
    assert clone["args"] == [
        {"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}
    ]
    (clone3,) = [r for r in profile["syscalls"] if r["names"] == ["clone3"]]
    assert clone3["errnoRet"] == ENOSYS
    assert DEFAULT["syscalls"][0]["names"] == ["read", "unshare", "mount", "clone"]  # not modified
    with pytest.raises(ValueError, match="syscalls"):
        seccomp_profile({"defaultAction": "SCMP_ACT_ALLOW"})


def test_podman_gets_a_user_namespace_and_docker_does_not() -> None:
    podman = engine_security_args(podman=True, seccomp_file="/x.json")
    assert podman[:2] == ["--cap-drop", "ALL"] and "seccomp=/x.json" in podman
    assert f"0:{USERNS_HOST_BASE}:65536" in podman and "no-new-privileges" in podman
    assert "--uidmap" not in engine_security_args(podman=False)


@pytest.mark.slow
@pytest.mark.skipif(find_engine() is None, reason="no container engine (.ci/run installs podman and runc)")
def test_the_agent_in_a_container_is_an_unprivileged_host_user_without_capabilities() -> None:
    build_base(DEFAULT_BASE)

    async def look() -> str:
        backend = OciBackend()
        box = await backend.create(
            name=f"gyre-policy-{uuid.uuid4().hex[:8]}",
            image=DEFAULT_BASE,
            limits=ContainerLimits(memory_mb=256),
        )
        try:
            script = (
                "id -u; head -1 /proc/self/uid_map; "
                "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
                "unshare --user true 2>/dev/null && echo USERNS_OK; "
                "touch /usr/x 2>/dev/null && echo WROTE_USR; "
                "mount -t tmpfs none /tmp 2>/dev/null && echo MOUNTED; true"
            )
            done = await box.exec(["sh", "-c", script], timeout_s=60, user=f"{AGENT_UID}:{AGENT_UID}")
            return done.output.decode()
        finally:
            await box.close()

    out = asyncio.run(look())
    lines = out.split("\n")
    assert lines[0] == str(AGENT_UID)
    assert lines[1].split() == ["0", str(USERNS_HOST_BASE), "65536"]  # root inside is no host root
    assert "CapEff:\t0000000000000000" in out and "NoNewPrivs:\t1" in out and "Seccomp:\t2" in out
    assert "USERNS_OK" not in out and "WROTE_USR" not in out and "MOUNTED" not in out


@pytest.mark.slow
@pytest.mark.skipif(find_engine() is None, reason="no container engine (.ci/run installs podman and runc)")
def test_a_bare_workdir_of_the_image_is_the_containers_own_not_nobodys(tmp_path: Path) -> None:
    """A Dockerfile's `WORKDIR /app` with nothing after it puts no /app in any layer: Podman made
    it at start outside the uid map, where not even the container's root could write (Harbor
    tasks' solutions and diffs failed)."""
    build_base(DEFAULT_BASE)
    image = "localhost/gyre-test-bare-workdir:1"
    (tmp_path / "Containerfile").write_text(f"FROM {DEFAULT_BASE}\nWORKDIR /app\n")
    engine = find_engine() or []
    subprocess.run([*engine, "build", "-q", "--network", "none", "-t", image, str(tmp_path)], check=True)

    async def write(workdir: str) -> tuple[int, str]:
        box = await OciBackend().create(
            name=f"gyre-policy-{uuid.uuid4().hex[:8]}",
            image=image,
            limits=ContainerLimits(memory_mb=256),
            workdir=workdir,
        )
        try:
            done = await box.exec(
                ["sh", "-c", "mkdir -p /app && touch /app/made && stat -c %u /app"], timeout_s=60
            )
            return done.exit_code, done.output.decode().strip()
        finally:
            await box.close()

    for workdir in ("", "/app"):  # the engine's writable root, and the workdir's own disk
        assert asyncio.run(write(workdir)) == (0, "0"), workdir
