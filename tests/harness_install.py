"""Installs the real harnesses the tests run: the Claude Code CLI from npm, once, into
`.gyre/harnesses/claude-code`; mini-swe-agent comes with the dev extra (`pip install -e '.[dev]'`).

A machine without npm skips the Claude Code tests with the reason; an install that fails fails.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
HARNESSES = REPO_ROOT / ".gyre" / "harnesses"
CLAUDE_CODE_VERSION = "2.1.197"
INSTALL_TIMEOUT_S = 600


def _run_install(argv: list[str], what: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
    if result.returncode != 0:
        pytest.fail(
            f"installing {what} failed ({' '.join(argv)}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        )


def install_claude_code() -> Path:
    """The Claude Code CLI binary, installed from npm into .gyre/harnesses/claude-code once."""
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the Claude Code tests need it (apt-get install nodejs npm)")
    prefix = HARNESSES / "claude-code"
    stamp = prefix / f".installed-{CLAUDE_CODE_VERSION}"
    if not stamp.exists():
        prefix.mkdir(parents=True, exist_ok=True)
        package = f"@anthropic-ai/claude-code@{CLAUDE_CODE_VERSION}"
        _run_install(
            [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), package],
            "the Claude Code CLI",
        )
        stamp.touch()
    # The package ships its native binary in a per-platform optional dependency.
    candidates = sorted((prefix / "node_modules" / "@anthropic-ai").glob("claude-code-linux-*/claude"))
    candidates.append(prefix / "node_modules" / "@anthropic-ai" / "claude-code" / "bin" / "claude.exe")
    for path in candidates:
        if (
            path.is_file()
            and subprocess.run([str(path), "--version"], capture_output=True, timeout=60).returncode == 0
        ):
            return path
    pytest.fail(f"the Claude Code CLI was installed into {prefix} but no runnable binary was found")


def mini_swe_agent() -> Path:
    """The `mini` command of mini-swe-agent, beside this interpreter (the dev extra installs it)."""
    mini = Path(sys.executable).parent / "mini"
    if not mini.is_file():
        pytest.fail(
            f"mini-swe-agent is missing from {mini.parent}: install the dev extra (make .venv/.installed)"
        )
    return mini
