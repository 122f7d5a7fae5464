"""Sandboxes for untrusted, model-written code: a minimal root of its own (bubblewrap), a user,
resource limits, a disk quota, no network but one forwarded port, and a wall-clock deadline.

Shared by the runner (harness processes) and the evaluator (graders run inside a sandbox, never
outside). Pure: `limits` (what a sandbox may use, the isolation plan), `rootfs` (what it sees),
`seccomp` (the syscall filter). Shells: `host` (create, run, kill, release), `launcher` (the
command that starts it), `init` (its first process, inside), `forward` (the host's half of the
proxy port), `probe` (what the kernel allows), `trees` (copy and remove trees it shaped).
"""
