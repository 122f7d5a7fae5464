"""The agent's tools: schemas for the model and their implementations (shell: files, processes)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from services.runner.agent.context import truncate

OUTPUT_LIMIT = 8000


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_PATH = {"type": "string", "description": "path relative to the workspace"}
SCHEMAS = [
    _fn("read_file", "Read a text file of the workspace.", {"path": _PATH}, ["path"]),
    _fn(
        "write_file",
        "Create or overwrite a text file of the workspace (folders are created).",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
    _fn(
        "shell",
        "Run a shell command in the workspace; returns exit code and output.",
        {"command": {"type": "string"}, "timeout_s": {"type": "number"}},
        ["command"],
    ),
    _fn(
        "run_tests",
        "Run the workspace's tests (pytest) and return the summary.",
        {"args": {"type": "string"}},
        [],
    ),
]
DELEGATE = _fn(
    "delegate",
    "Hand a self-contained sub-task to a sub-agent with a fresh context; returns its final answer.",
    {"task": {"type": "string"}},
    ["task"],
)


class Workspace:
    """Tool implementations rooted at the workspace folder (the sandbox is the security boundary)."""

    def __init__(self, root: Path, *, shell_timeout_s: float = 120.0):
        self.root = root.resolve()
        self.shell_timeout_s = shell_timeout_s

    def _path(self, rel: str) -> Path:
        p = (self.root / rel).resolve()
        if p != self.root and self.root not in p.parents:
            raise ValueError(f"path {rel!r} leaves the workspace")
        return p

    def read_file(self, path: str) -> str:
        return truncate(self._path(path).read_text(errors="replace"), limit=OUTPUT_LIMIT)

    def write_file(self, path: str, content: str) -> str:
        p = self._path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        return f"wrote {len(content)} characters to {path}"

    def shell(self, command: str, timeout_s: float | None = None) -> str:
        limit = min(float(timeout_s or self.shell_timeout_s), self.shell_timeout_s)
        try:
            done = subprocess.run(
                ["/bin/sh", "-c", command],
                cwd=self.root,
                capture_output=True,
                text=True,
                timeout=limit,
                errors="replace",
            )
        except subprocess.TimeoutExpired:
            return f"timed out after {limit:.0f} s"
        return truncate(f"exit code {done.returncode}\n{done.stdout}{done.stderr}", limit=OUTPUT_LIMIT)

    def run_tests(self, args: str = "") -> str:
        return self.shell(f"python -m pytest -q {args}".strip())

    def dispatch(self, name: str, arguments: str, *, delegate: Callable[[str], str]) -> str:
        """Run one tool call; any failure becomes text for the model, never a crash of the agent."""
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
            if name == "delegate":
                return delegate(str(args["task"]))
            methods: dict[str, Callable[..., str]] = {
                "read_file": self.read_file,
                "write_file": self.write_file,
                "shell": self.shell,
                "run_tests": self.run_tests,
            }
            method = methods.get(name)
            if method is None:
                return f"error: unknown tool {name!r}"
            return str(method(**args))
        except (ValueError, KeyError, TypeError, OSError) as exc:
            return f"error: {type(exc).__name__}: {exc}"
