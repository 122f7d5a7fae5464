"""The minimal root a sandbox sees, as a bubblewrap command line (pure).

Inside, a process sees only: the read-only system runtime (`/usr` and the top-level links or
folders into it), a few read-only files of `/etc` (the loader cache, certificates, time zone,
and a passwd/group naming only root, nobody and the sandbox user), the read-only runtime paths
the host names (the Python installation, a harness's own files), its own workspace and home
(read-write), the host's read-only extras (the grader's files), a private `/tmp` (also `/var/tmp`
and `/dev/shm`, all inside the sandbox's quota), a fresh `/proc` of its own pid namespace and a
minimal `/dev`. No `/run`, `/var`, `/home`, `/root`, `/sys`, project checkout or other sandbox
exists there, so no host Unix socket (Postgres, MariaDB, Redis, ...) can be reached. It gets its
own user, pid, IPC, UTS, network, mount and cgroup namespaces (SysV shared memory dies with it),
no capabilities, no further user namespaces, no_new_privs, the seccomp filter, and the root is
remounted read-only at the end.

Example:
    bwrap_argv(RootPlan(bwrap="/x/bwrap", top_links={"bin": "usr/bin"}, ...), ["python", "-I", ...])
    -> ["/x/bwrap", "--die-with-parent", "--new-session", "--unshare-all", ..., "--", "python", ...]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

ETC_FILES = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "nsswitch.conf",
    "ssl", "ca-certificates", "hosts", "mime.types", "gitconfig",
)  # fmt: skip
"""Entries of the host's /etc a sandbox may read (those present); everything else is absent."""
TOP_LEVEL = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
"""Top-level names that are links into /usr on merged-usr systems (or folders on older ones)."""
PRIVATE_TMP = ("/tmp", "/var/tmp", "/dev/shm")
INIT_PATH = "/.gyre/init.py"
FORWARD_DIR = "/.gyre/forward"
"""Where the first process's script and the forwarder's socket folder appear inside."""
HOSTNAME = "gyre-sandbox"


@dataclass(frozen=True, slots=True, kw_only=True)
class RootPlan:
    """What the host found and prepared: `(source, path inside)` pairs. bwrap runs as the sandbox
    user, so every source must be reachable by that user: the host stages the runtime (the
    Python installation may sit under /root) and passes small files as descriptors."""

    bwrap: str
    top_links: Mapping[str, str] = field(default_factory=dict)
    """Top-level link name -> its target (e.g. bin -> usr/bin), as on the host."""
    top_dirs: Sequence[str] = ()
    """Top-level runtime folders that are real folders on the host (e.g. lib64 on old systems)."""
    etc: Sequence[str] = ()
    """Names of ETC_FILES present on the host."""
    files: Sequence[tuple[int, str]] = ()
    """Read-only files copied in from descriptors: passwd, group, the first process's script."""
    runtime: Sequence[tuple[str, str]] = ()
    """Read-only: the Python installation, a harness's own files."""
    read_write: Sequence[tuple[str, str]] = ()
    """Read-write: the workspace and the home folder."""
    private_tmp: str
    """The sandbox's own temp folder, mounted at each of PRIVATE_TMP."""
    read_only: Sequence[tuple[str, str]] = ()
    """Read-only, mounted last: host-written files (the grader's) beside the workspace."""
    seccomp_fd: int | None = None
    cwd: str


def bwrap_argv(plan: RootPlan, command: Sequence[str]) -> list[str]:
    argv = [
        plan.bwrap,
        "--die-with-parent",  # the host killing bwrap takes the whole sandbox down
        "--new-session",  # no TIOCSTI into a terminal outside
        "--unshare-all",
        "--as-pid-1",  # init is pid 1: no bwrap process of the sandbox user, dumpable, sits inside
        "--unshare-user",
        "--disable-userns",
        "--assert-userns-disabled",
        "--cap-drop",
        "ALL",
        "--hostname",
        HOSTNAME,
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for name, target in sorted(plan.top_links.items()):
        argv += ["--symlink", target, f"/{name}"]
    for name in plan.top_dirs:
        argv += ["--ro-bind", f"/{name}", f"/{name}"]
    for name in plan.etc:
        argv += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for target in PRIVATE_TMP:
        argv += ["--bind", plan.private_tmp, target]
    for flag, pairs in (
        ("--ro-bind", plan.runtime),
        ("--bind", plan.read_write),
        ("--ro-bind", plan.read_only),
    ):
        for source, inside in pairs:
            argv += [flag, source, inside]
    for fd, inside in plan.files:
        argv += ["--ro-bind-data", str(fd), inside]
    if plan.seccomp_fd is not None:
        argv += ["--seccomp", str(plan.seccomp_fd)]
    argv += ["--remount-ro", "/", "--chdir", plan.cwd, "--", *command]
    return argv


def passwd_text(*, uid: int, gid: int, user: str, home: str) -> tuple[str, str]:
    """/etc/passwd and /etc/group as the sandbox sees them: root, nobody and its own user.

    Example:
        passwd_text(uid=62001, gid=62001, user="gyre62001", home="/s/home")[0].splitlines()[2]
        -> "gyre62001:x:62001:62001::/s/home:/bin/sh"
    """
    name = user or f"u{uid}"
    passwd = (
        "root:x:0:0::/nonexistent:/usr/sbin/nologin\n"
        "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
        f"{name}:x:{uid}:{gid}::{home}:/bin/sh\n"
    )
    group = f"root:x:0:\nnogroup:x:65534:\n{name}:x:{gid}:\n"
    return passwd, group
