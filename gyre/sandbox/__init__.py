"""Sandboxes for untrusted, model-written code: a folder and a user of its own, resource limits,
a disk quota, no network but one forwarded port, and a wall-clock deadline.

Shared by the runner (harness processes) and the evaluator (graders run inside a sandbox, never
outside). `limits` is pure; `host` prepares and launches (shell); `init` is pid 1 inside the
namespaces (shell).
"""
