"""What a container may do, as the engine's arguments (pure): user namespace, capabilities, seccomp.

The guarantees of the bubblewrap root (docs/design/sandbox.md), in an OCI engine's terms:

- *no host root*: Podman maps the container's uids 0..65535 onto host uids USERNS_HOST_BASE..+65535
  (`--uidmap`), so even the container's root is an unprivileged host user; the agent's harness
  runs as AGENT_UID inside (host uid USERNS_HOST_BASE + AGENT_UID), never as the container's root.
- *capabilities*: every one dropped but the few the container's root needs to set the workspace
  up (own the workdir, kill the harness's processes); a non-root process keeps none of them, and
  `no-new-privileges` stops setuid files from giving them back.
- *seccomp*: the engine's default profile (Podman's allows `unshare`, `mount`, `setns`, `keyctl`
  and `ptrace` to every container) with the calls the bubblewrap root's filter refuses taken out:
  namespaces, mounts, keyrings, bpf, perf, ptrace, io_uring, userfaultfd; `clone` may not ask
  for a namespace and `clone3` answers ENOSYS so the C library falls back to `clone`.

Docker has no per-container uid map (its user namespaces are the daemon's `userns-remap`), so on
Docker the container's root is the host's root with the capabilities and filter above.

Example:
    profile = seccomp_profile(json.loads(Path(DEFAULT_SECCOMP).read_text()))
    argv += engine_security_args(podman=True, seccomp_file="/run/x/seccomp.json")
"""

from __future__ import annotations

import copy
from typing import Any

USERNS_HOST_BASE = 400000
"""First host uid of the containers' user namespace (0..65535 inside map to 400000..465535);
apart from the host's users and the bubblewrap sandboxes' 64000.. range."""
USERNS_SIZE = 65536
AGENT_UID = 61000
"""The harness's uid and gid inside every container (host uid 461000): no user an image brings."""
SETUP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETUID", "SETGID")
"""What the container's root keeps: own the workdir for the agent, write where the image says
root only, kill the harness's processes at the deadline, and become the agent (`exec --user`)."""
DEFAULT_SECCOMP = "/usr/share/containers/seccomp.json"
"""Podman's default profile (containers-common); the base the container profile narrows."""
BLOCKED_CALLS = frozenset(
    {
        "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree",
        "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "keyctl", "add_key",
        "request_key", "bpf", "perf_event_open", "ptrace", "process_vm_readv", "process_vm_writev",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "clone", "clone3",
    }
)  # fmt: skip
"""Calls taken out of the default allow lists (clone comes back below, without namespaces)."""
CLONE_NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: clone may set none."""
ENOSYS, EPERM = 38, 1


def seccomp_profile(default: dict[str, Any]) -> dict[str, Any]:
    """The engine's default profile without BLOCKED_CALLS; clone without namespaces; clone3 ENOSYS.

    Example: seccomp_profile({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
                 {"names": ["read", "unshare"], "action": "SCMP_ACT_ALLOW"}]})
             -> syscalls: read allowed, unshare gone (so refused by the default action), and
                the clone and clone3 rules added.
    """
    if not isinstance(default.get("syscalls"), list):
        raise ValueError("a seccomp profile needs a 'syscalls' list")
    profile = copy.deepcopy(default)
    kept = []
    for rule in profile["syscalls"]:
        names = [n for n in rule.get("names", []) if n not in BLOCKED_CALLS]
        if not names:
            continue
        kept.append(rule | {"names": names})
    kept.append(
        {
            "names": ["clone"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": CLONE_NAMESPACE_FLAGS, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}],
        }
    )
    kept.append({"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS})
    profile["syscalls"] = kept
    return profile


def engine_security_args(*, podman: bool, seccomp_file: str = "") -> list[str]:
    """The `run` arguments that confine a container (user namespace on Podman only)."""
    args = ["--cap-drop", "ALL", "--cap-add", ",".join(SETUP_CAPS), "--security-opt", "no-new-privileges"]
    if seccomp_file:
        args += ["--security-opt", f"seccomp={seccomp_file}"]
    if podman:
        mapping = f"0:{USERNS_HOST_BASE}:{USERNS_SIZE}"
        args += ["--uidmap", mapping, "--gidmap", mapping]
    return args


def host_uid(inside: int, *, podman: bool) -> int:
    """The host uid a uid inside the container is (Docker: the same)."""
    return USERNS_HOST_BASE + inside if podman else inside
