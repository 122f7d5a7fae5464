"""The seccomp filter every sandboxed process runs under, as a classic BPF program (pure).

bwrap loads it (`--seccomp FD`) right before it starts the sandbox's first process, after it
set no_new_privs; every process inside inherits it and none can lift it. The filter denies
(EPERM) what a coding agent never needs and what widens the kernel's attack surface or leaves
the sandbox's namespaces: mounting, new namespaces (`unshare`, `setns`, namespace flags on
`clone`), kernel keyrings, module loading, bpf, perf, ptrace, userfaultfd, io_uring, file
handles, clock and host settings, and descriptors of other processes (`pidfd_open`,
`pidfd_getfd`: the sandbox's first process is not dumpable either, this closes the way twice).
`clone3` answers ENOSYS so the C library falls back to `clone`, whose flags the filter can read.
`socket` and `socketpair` are allowed for AF_UNIX, AF_INET and AF_INET6 only; any other family
(vsock, which the network namespace does not cover, packet, netlink, ...) answers EAFNOSUPPORT,
as on a kernel built without it. A foreign architecture (x32 numbers, or a 32-bit binary) is
killed outright. Only x86_64 and aarch64 have tables; `program_for` says so for others.

Example:
    program_for("x86_64") -> bytes, 8 bytes per instruction (struct sock_filter), ready for bwrap
"""

from __future__ import annotations

import errno
import struct

# struct sock_filter { u16 code; u8 jt; u8 jf; u32 k; }
LD_W_ABS = 0x20
JEQ_K = 0x15
JGE_K = 0x35
JSET_K = 0x45
RET_K = 0x06
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
X32_SYSCALL_BIT = 0x40000000
NAMESPACE_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET."""
OFFSET_NR, OFFSET_ARCH, OFFSET_ARG0_LOW = 0, 4, 16
AF_UNIX, AF_INET, AF_INET6 = 1, 2, 10
ALLOWED_FAMILIES = (AF_UNIX, AF_INET, AF_INET6)

DENIED = (
    "mount", "umount2", "pivot_root", "swapon", "swapoff", "reboot", "sethostname",
    "setdomainname", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "acct", "quotactl", "add_key", "request_key", "keyctl", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "iopl", "ioperm", "uselib", "personality",
    "pidfd_open", "pidfd_getfd",
)  # fmt: skip
"""Denied with EPERM wherever the architecture has them."""

ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    # AUDIT_ARCH_X86_64 and the x86_64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
    "x86_64": (
        0xC000003E,
        {
            "clone": 56, "clone3": 435, "mount": 165, "umount2": 166, "pivot_root": 155,
            "swapon": 167, "swapoff": 168, "reboot": 169, "sethostname": 170,
            "setdomainname": 171, "init_module": 175, "finit_module": 313, "delete_module": 176,
            "kexec_load": 246, "kexec_file_load": 320, "acct": 163, "quotactl": 179,
            "add_key": 248, "request_key": 249, "keyctl": 250, "unshare": 272, "setns": 308,
            "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "ptrace": 101,
            "process_vm_readv": 310, "process_vm_writev": 311, "kcmp": 312,
            "open_by_handle_at": 304, "name_to_handle_at": 303, "lookup_dcookie": 212,
            "syslog": 103, "vhangup": 153, "settimeofday": 164, "clock_settime": 227,
            "clock_adjtime": 305, "adjtimex": 159, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
            "iopl": 172, "ioperm": 173, "uselib": 134, "personality": 135,
            "pidfd_open": 434, "pidfd_getfd": 438, "socket": 41, "socketpair": 53,
        },
    ),
    # AUDIT_ARCH_AARCH64 and the generic syscall numbers (include/uapi/asm-generic/unistd.h).
    "aarch64": (
        0xC00000B7,
        {
            "clone": 220, "clone3": 435, "mount": 40, "umount2": 39, "pivot_root": 41,
            "swapon": 224, "swapoff": 225, "reboot": 142, "sethostname": 161,
            "setdomainname": 162, "init_module": 105, "finit_module": 273, "delete_module": 106,
            "kexec_load": 104, "kexec_file_load": 294, "acct": 89, "quotactl": 60,
            "add_key": 217, "request_key": 218, "keyctl": 219, "unshare": 97, "setns": 268,
            "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "ptrace": 117,
            "process_vm_readv": 270, "process_vm_writev": 271, "kcmp": 272,
            "open_by_handle_at": 265, "name_to_handle_at": 264, "lookup_dcookie": 18,
            "syslog": 116, "vhangup": 58, "settimeofday": 170, "clock_settime": 112,
            "clock_adjtime": 266, "adjtimex": 171, "io_uring_setup": 425, "io_uring_enter": 426,
            "io_uring_register": 427, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
            "fspick": 433, "move_mount": 429, "open_tree": 428, "mount_setattr": 442,
            "personality": 92, "pidfd_open": 434, "pidfd_getfd": 438, "socket": 198,
            "socketpair": 199,
        },
    ),
}  # fmt: skip


Insn = tuple[int, int, str, str]
"""(code, k, label if true, label if false): jumps by name, resolved by `_assemble`."""


def _assemble(program: list[Insn | str]) -> bytes:
    """Lay out instructions and labels (plain strings) as struct sock_filter, jumps resolved.

    Example: [(JEQ_K, 1, "yes", ""), (RET_K, 0, "", ""), "yes", (RET_K, 1, "", "")]
        -> JEQ 1 jt=1 jf=0; RET 0; RET 1   (a jump counts the instructions it skips)
    """
    where: dict[str, int] = {}
    insns: list[Insn] = []
    for item in program:
        if isinstance(item, str):
            where[item] = len(insns)
        else:
            insns.append(item)
    out = []
    for n, (code, k, jt, jf) in enumerate(insns):
        skip_t = where[jt] - n - 1 if jt else 0
        skip_f = where[jf] - n - 1 if jf else 0
        assert 0 <= skip_t < 256 and 0 <= skip_f < 256, "classic BPF jumps forward, by at most 255"
        out.append(struct.pack("=HBBI", code, skip_t, skip_f, k))
    return b"".join(out)


def program_for(machine: str) -> bytes | None:
    """The filter for `machine` (`os.uname().machine`), or None when there is no table for it."""
    if machine not in ARCHES:
        return None
    audit_arch, numbers = ARCHES[machine]
    deny = [numbers[name] for name in DENIED if name in numbers]
    program: list[Insn | str] = [
        (LD_W_ABS, OFFSET_ARCH, "", ""),
        (JEQ_K, audit_arch, "native", ""),
        (RET_K, SECCOMP_RET_KILL_PROCESS, "", ""),
        "native",
        (LD_W_ABS, OFFSET_NR, "", ""),
    ]
    if machine == "x86_64":  # x32 numbers carry bit 30: the same arch value, other meanings
        program += [(JGE_K, X32_SYSCALL_BIT, "kill", "")]
    program += [(JEQ_K, nr, "eperm", "") for nr in deny]
    program += [
        (JEQ_K, numbers["clone3"], "enosys", ""),
        (JEQ_K, numbers["clone"], "clone_flags", ""),
        (JEQ_K, numbers["socket"], "family", ""),
        (JEQ_K, numbers["socketpair"], "family", ""),
        (RET_K, SECCOMP_RET_ALLOW, "", ""),
        "clone_flags",  # clone with a namespace flag -> EPERM
        (LD_W_ABS, OFFSET_ARG0_LOW, "", ""),
        (JSET_K, NAMESPACE_FLAGS, "eperm", "allow"),
        "family",  # the domain is an int: its low 32 bits are all the kernel reads
        (LD_W_ABS, OFFSET_ARG0_LOW, "", ""),
        *[(JEQ_K, family, "allow", "") for family in ALLOWED_FAMILIES],
        (RET_K, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT, "", ""),
        "allow",
        (RET_K, SECCOMP_RET_ALLOW, "", ""),
        "eperm",
        (RET_K, SECCOMP_RET_ERRNO | errno.EPERM, "", ""),
        "enosys",
        (RET_K, SECCOMP_RET_ERRNO | errno.ENOSYS, "", ""),
        "kill",
        (RET_K, SECCOMP_RET_KILL_PROCESS, "", ""),
    ]
    return _assemble(program)
