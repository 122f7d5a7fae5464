"""Architecture boundaries (DESIGN §2, STYLE): read from the source, nothing imported or run.

- the kernel (`gyre/`) never names a service: no import of `services`, no `services.` or
  `services/` in its code or text, no dynamic import;
- no service imports another service (each talks to the others through contracts only);
- nothing below the application package imports it (`gyre_app` sits above the services);
- a module whose first docstring line calls it pure imports no I/O library;
- no hand-written Python file passes 500 lines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "gyre"
SERVICES = ROOT / "services"
MAX_LINES = 500
IO_LIBRARIES = frozenset(
    {
        "aiohttp",
        "alembic",
        "asyncio",
        "asyncpg",
        "grpc",
        "http",
        "httpx",
        "nats",
        "requests",
        "selectors",
        "socket",
        "sqlalchemy",
        "structlog",
        "subprocess",
        "urllib",
    }
)
PURE_MARK = re.compile(r"\(pure\b")


def _generated(path: Path) -> bool:
    return "_pb2" in path.name


def _python_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if not _generated(path) and ".venv" not in path.parts and "tasks" not in path.parts:
                yield path


def _imported_modules(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_kernel_imports_no_service() -> None:
    offenders = [
        f"{_rel(p)} imports {m}"
        for p in _python_files(KERNEL)
        for m in _imported_modules(p)
        if m.split(".")[0] in ("services", "gyre_app")
    ]
    assert offenders == []


def test_kernel_never_names_services_or_imports_dynamically() -> None:
    pattern = re.compile(r"services[./]|import_module|__import__")
    offenders = [
        f"{_rel(p)}:{n}: {line.strip()}"
        for p in _python_files(KERNEL)
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []


def test_no_service_imports_another() -> None:
    offenders = []
    for path in _python_files(SERVICES):
        own = path.relative_to(SERVICES).parts[0]
        for module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] == "gyre_app" or (parts[0] == "services" and len(parts) > 1 and parts[1] != own):
                offenders.append(f"{_rel(path)} imports {module}")
    assert offenders == []


def _pure_modules() -> Iterator[Path]:
    for path in _python_files(KERNEL, SERVICES):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        if PURE_MARK.search(doc.split("\n\n")[0]):
            yield path


def test_some_modules_declare_themselves_pure() -> None:
    """Guards the check below against a docstring convention that silently stopped matching."""
    assert len(list(_pure_modules())) >= 20


def test_pure_modules_import_no_io_library() -> None:
    offenders = [
        f"{_rel(p)} imports {m}"
        for p in _pure_modules()
        for m in _imported_modules(p)
        if m.split(".")[0] in IO_LIBRARIES
    ]
    assert offenders == []


@pytest.mark.parametrize("root", ["gyre", "gyre_app", "services", "tests", "bench"])
def test_no_hand_written_file_passes_500_lines(root: str) -> None:
    too_long = {
        _rel(p): n for p in _python_files(ROOT / root) if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert too_long == {}
