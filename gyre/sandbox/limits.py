"""Resource limits and the isolation a sandbox gets (pure).

The host decides the isolation once from what the kernel allows (`Isolation`); `plan_isolation`
turns the wish (`mode`) and the probe into a decision with the reasons for every fallback, so a
refused capability is never silent.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from gyre.errors import InvalidArgument

MIB = 1024 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxLimits:
    """What one sandbox may consume. Every limit is enforced by the kernel where it allows it."""

    cpu_s: int = 3600
    """CPU seconds per process (RLIMIT_CPU)."""
    memory_mb: int = 2048
    """Resident memory of all its processes (the memory cgroup) and, unless `address_space_mb`
    says otherwise, the address space per process (RLIMIT_AS)."""
    address_space_mb: int = 0
    """Address space per process (RLIMIT_AS) when it must differ from `memory_mb` (a runtime
    such as Node's reserves far more than it touches); 0: `memory_mb`."""
    max_procs: int = 256
    """Processes of the sandbox user (RLIMIT_NPROC, per dedicated uid) and the pids cgroup."""
    file_size_mb: int = 512
    """Largest file one process may write (RLIMIT_FSIZE)."""
    disk_mb: int = 1024
    """Size of the sandbox folder: a size-limited tmpfs, or the watcher's limit in the fallback."""

    open_files: int = 1024
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    cpus: float = 2.0
    """CPU time per wall-clock second of all its processes together (the cpu cgroup's quota)."""
    max_connections: int = 64
    """Connections open at once through the forwarded proxy port."""

    @classmethod
    def of(cls, settings: object) -> SandboxLimits:
        """The limits a service's settings name (fields of the same names); defaults for the rest."""
        return cls(**{f.name: getattr(settings, f.name) for f in fields(cls) if hasattr(settings, f.name)})

    def validate(self, at: str = "limits") -> None:
        for name in (
            "cpu_s",
            "memory_mb",
            "max_procs",
            "file_size_mb",
            "disk_mb",
            "open_files",
            "max_connections",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int) and value > 0):
                raise InvalidArgument(f"{at}.{name}", f"must be a positive integer, got {value!r}")
        if not (isinstance(self.address_space_mb, int) and self.address_space_mb >= 0):
            raise InvalidArgument(
                f"{at}.address_space_mb",
                f"must be 0 (same as memory_mb) or a positive integer, got {self.address_space_mb!r}",
            )
        if not (isinstance(self.cpus, (int, float)) and 0.01 <= self.cpus <= 1024):
            raise InvalidArgument(
                f"{at}.cpus", f"must be a number of CPUs in [0.01, 1024], got {self.cpus!r}"
            )
        if self.max_procs < 4:
            raise InvalidArgument(
                f"{at}.max_procs", f"must be at least 4 (a shell and a test run), got {self.max_procs}"
            )

    def cfs_quota(self, period_us: int = 100_000) -> tuple[int, int]:
        """cpu.cfs_period_us and cpu.cfs_quota_us for `cpus`.

        Example: SandboxLimits(cpus=1.5).cfs_quota() -> (100000, 150000)
        """
        return period_us, max(1000, round(self.cpus * period_us))

    def rlimits(self) -> dict[str, tuple[int, int]]:
        """setrlimit arguments by resource name, soft == hard so the sandbox cannot raise them.

        Example:
            SandboxLimits(cpu_s=10, memory_mb=256, max_procs=32, file_size_mb=8, disk_mb=64).rlimits()
            -> {"RLIMIT_CPU": (10, 10), "RLIMIT_AS": (268435456, 268435456), ...}
        """
        address_space = (self.address_space_mb or self.memory_mb) * MIB
        return {
            "RLIMIT_CPU": (self.cpu_s, self.cpu_s),
            "RLIMIT_AS": (address_space, address_space),
            "RLIMIT_NPROC": (self.max_procs, self.max_procs),
            "RLIMIT_FSIZE": (self.file_size_mb * MIB, self.file_size_mb * MIB),
            "RLIMIT_NOFILE": (self.open_files, self.open_files),
            "RLIMIT_CORE": (0, 0),
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Capabilities:
    """What the kernel and this process allow, as probed by the host."""

    root: bool
    namespaces: bool
    """bwrap starts a process in fresh user, pid, IPC, UTS, net and mount namespaces here."""
    bwrap: str = ""
    setpriv: str = ""
    """Switches bwrap to the sandbox user when the host is root."""
    unshare: str = ""
    """Gives the launcher a mount namespace of its own (staging the runtime) when root."""
    tmpfs: bool
    """A size-limited tmpfs can be mounted (the disk quota)."""
    cgroup_memory: str = ""
    """Writable cgroup-v1 memory folder to create children in; empty when not writable."""
    cgroup_pids: str = ""
    """Writable cgroup-v1 pids folder; empty when not writable."""
    cgroup_cpu: str = ""
    """Writable cgroup-v1 cpu folder (the CPU quota); empty when not writable."""
    useradd: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class Isolation:
    """What a sandbox will get, with why each missing piece is missing."""

    own_user: bool
    namespaces: bool
    """The minimal root in user, pid, IPC, UTS, mount and net namespaces, seccomp, no_new_privs:
    only loopback and the forwarded proxy port."""
    tmpfs_quota: bool
    cgroups: bool
    fallbacks: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        parts = [
            "own uid" if self.own_user else "runner's uid",
            "minimal root, namespaces, seccomp" if self.namespaces else "no namespaces",
            "tmpfs quota" if self.tmpfs_quota else "fsize+watcher quota",
            "cgroups" if self.cgroups else "rlimits only",
        ]
        return ", ".join(parts)


MODES = ("auto", "strict", "rlimits")


def plan_isolation(caps: Capabilities, *, mode: str) -> Isolation:
    """Decide the isolation: `strict` refuses anything less than full, `rlimits` forces the fallback.

    Example:
        plan_isolation(Capabilities(root=True, namespaces=False, tmpfs=True), mode="auto")
        -> Isolation(own_user=True, namespaces=False, ..., fallbacks=("network: ... not isolated",))
    """
    if mode not in MODES:
        raise InvalidArgument("sandbox_mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "rlimits":
        caps = Capabilities(root=caps.root, namespaces=False, tmpfs=False, useradd=caps.useradd)
    if caps.root and not (caps.setpriv and caps.unshare):  # bwrap must never run as root
        caps = replace(caps, namespaces=False)
    fallbacks = []
    if not caps.root:
        fallbacks.append("user: not root, the harness runs as the runner's own uid")
    if not caps.namespaces:
        fallbacks.append(
            "namespaces: bwrap cannot start a sandbox here, so the harness sees the host's files "
            "(as its own uid), can reach any address and Unix socket the host can, shares SysV IPC "
            "and has no seccomp filter"
        )
    if not (caps.root and caps.tmpfs):
        fallbacks.append(
            "disk: no tmpfs, RLIMIT_FSIZE bounds each file and a watcher kills the sandbox when the "
            "folder passes the quota; bursts between two watcher passes and writes outside the folder "
            "(to /tmp) are not bounded"
        )
    cgroups = caps.root and bool(caps.cgroup_memory) and bool(caps.cgroup_pids)
    if not cgroups:
        fallbacks.append("memory/pids: no cgroups, only per-process RLIMIT_AS and per-uid RLIMIT_NPROC")
    if not (cgroups and caps.cgroup_cpu):
        fallbacks.append("cpu: no cpu cgroup, only per-process RLIMIT_CPU seconds")
    isolation = Isolation(
        own_user=caps.root,
        namespaces=caps.namespaces,
        tmpfs_quota=caps.root and caps.tmpfs,
        cgroups=cgroups and mode != "rlimits",
        fallbacks=tuple(fallbacks),
    )
    if mode == "strict" and fallbacks:
        raise InvalidArgument(
            "sandbox_mode", "strict isolation is not available here: " + "; ".join(fallbacks)
        )
    return isolation


def disk_over_quota(used_bytes: int, *, disk_mb: int) -> bool:
    return used_bytes > disk_mb * MIB
