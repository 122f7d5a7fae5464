"""The seccomp filter every sandboxed process runs under, as a classic BPF program (pure).

bwrap loads it (`--seccomp FD`) right before it starts the sandbox's first process, after it
set no_new_privs; every process inside inherits it and none can lift it. The filter denies
(EPERM) what a coding agent never needs and what widens the kernel's attack surface or leaves
the sandbox's namespaces: mounting, new namespaces (`unshare`, `setns`, namespace flags on
`clone`), kernel keyrings, module loading, bpf, perf, ptrace, userfaultfd, io_uring, file
handles, clock and host settings. `clone3` answers ENOSYS so the C library falls back to
`clone`, whose flags the filter can read. A foreign architecture (x32 numbers, or a 32-bit
binary) is killed outright. Only x86_64 and aarch64 have tables; `program_for` says so for
others.

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

DENIED = (
    "mount", "umount2", "pivot_root", "swapon", "swapoff", "reboot", "sethostname",
    "setdomainname", "init_module", "finit_module", "delete_module", "kexec_load",
    "kexec_file_load", "acct", "quotactl", "add_key", "request_key", "keyctl", "unshare", "setns",
    "bpf", "perf_event_open", "userfaultfd", "ptrace", "process_vm_readv", "process_vm_writev",
    "kcmp", "open_by_handle_at", "name_to_handle_at", "lookup_dcookie", "syslog", "vhangup",
    "settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fsopen", "fsconfig", "fsmount", "fspick",
    "move_mount", "open_tree", "mount_setattr", "iopl", "ioperm", "uselib", "personality",
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
            "personality": 92,
        },
    ),
}  # fmt: skip


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program_for(machine: str) -> bytes | None:
    """The filter for `machine` (`os.uname().machine`), or None when there is no table for it."""
    if machine not in ARCHES:
        return None
    audit_arch, numbers = ARCHES[machine]
    deny = [numbers[name] for name in DENIED if name in numbers]
    eperm = SECCOMP_RET_ERRNO | errno.EPERM
    enosys = SECCOMP_RET_ERRNO | errno.ENOSYS
    # After the list (6 instructions to the returns): clone3 -> ENOSYS; clone with a namespace
    # flag -> EPERM; anything else is allowed.
    tail = [
        _insn(JEQ_K, numbers["clone3"], jt=5, jf=0),
        _insn(JEQ_K, numbers["clone"], jt=0, jf=2),
        _insn(LD_W_ABS, OFFSET_ARG0_LOW),
        _insn(JSET_K, NAMESPACE_FLAGS, jt=1, jf=0),
        _insn(RET_K, SECCOMP_RET_ALLOW),
        _insn(RET_K, eperm),
        _insn(RET_K, enosys),
    ]
    # Denied numbers: from instruction n of the list, EPERM sits after the rest of the list and
    # the first five tail instructions.
    body = [_insn(JEQ_K, nr, jt=len(deny) - n - 1 + 5, jf=0) for n, nr in enumerate(deny)]
    head = [
        _insn(LD_W_ABS, OFFSET_ARCH),
        _insn(JEQ_K, audit_arch, jt=1, jf=0),
        _insn(RET_K, SECCOMP_RET_KILL_PROCESS),
        _insn(LD_W_ABS, OFFSET_NR),
    ]
    if machine == "x86_64":  # x32 numbers carry bit 30: the same arch value, other meanings
        head += [_insn(JGE_K, X32_SYSCALL_BIT, jt=0, jf=1), _insn(RET_K, SECCOMP_RET_KILL_PROCESS)]
    return b"".join(head + body + tail)
