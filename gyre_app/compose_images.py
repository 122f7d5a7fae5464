"""The compose stack's images, built on this machine without an image registry (shell).

- Gyre's service image: deploy/Dockerfile `FROM` the Debian base `gyre images base` makes, with
  Debian's pip added (its EXTRA_PACKAGES). pip in the build runs with this machine's own
  configuration: the config files `pip config debug` finds and the local paths they name
  (find-links folders, local indexes, constraints, the certificate bundle) are mounted read-only
  where they are, so `torch==2.13.0` resolves to the CPU wheel on local disk exactly as it does
  for the checkout's venv, and nothing else is fetched from anywhere pip is not told to go.
- NATS and PostgreSQL: Debian's packages on the same base (deploy/local/).

Each tag ends in a hash of what the image is made from (its Containerfile, the files it copies,
its build arguments and the base image's id): a second run with nothing changed builds nothing.
A new build removes the older tags of the same name (images this module made); the layers stay
in Podman's cache, so a code change rebuilds only the layers from the first COPY on.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gyre.errors import Unavailable
from gyre_app.compose_plan import Images, parse_pip_config, pip_paths
from gyre_app.images import BUILD_TIMEOUT_S, DEFAULT_BASE, _engine, build_base, image_exists

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
SERVICE_REPOSITORY = "localhost/gyre-compose"
EXTRA_PACKAGES = "python3-pip python3-venv python-is-python3"
IGNORED = shutil.ignore_patterns("__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache")


@dataclass(slots=True)
class BuildReport:
    images: Images
    built: list[str] = field(default_factory=list)
    """Tags built by this call (empty: every image came from the cache)."""
    seconds: dict[str, float] = field(default_factory=dict)


def copied_sources(dockerfile: str) -> list[str]:
    """What a Dockerfile's COPY lines take from the context. Example: "COPY a b ./" -> ["a", "b"]"""
    sources: list[str] = []
    for line in dockerfile.splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    return sources


def tree_hash(root: Path, extra: Sequence[str]) -> str:
    """sha256 over every file under `root` (relative path and bytes, in path order) and `extra`."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for item in extra:
        digest.update(item.encode() + b"\0")
    return digest.hexdigest()[:16]


def pip_mounts() -> tuple[list[str], dict[str, str]]:
    """`-v` options that show the build this machine's pip configuration, and the build arguments
    that carry what the Dockerfile's own ARGs would otherwise blank (PIP_EXTRA_INDEX_URL)."""
    pip = [shutil.which("python3") or "python3", "-m", "pip"]
    listing = _output([*pip, "config", "list"])
    debug = _output([*pip, "config", "debug"])
    files = [line.split(",")[0].strip() for line in debug.splitlines() if line.endswith("exists: True")]
    settings = parse_pip_config(listing)
    paths = [p for p in [*files, *pip_paths(settings)] if Path(p).exists()]
    mounts = [f"--volume={p}:{p}:ro" for p in sorted(set(paths))]
    args = {}
    extra = [v for k, v in settings if k.endswith(".extra-index-url")]
    if extra:
        args["PIP_EXTRA_INDEX_URL"] = extra[-1]
    return mounts, args


def _output(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return done.stdout if done.returncode == 0 else ""


def _image_id(tag: str) -> str:
    done = subprocess.run(
        [*_engine(), "image", "inspect", "--format", "{{.Id}}", tag],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip()


def _build(tag: str, context: Path, containerfile: Path, args: dict[str, str], mounts: Sequence[str]) -> None:
    argv = [*_engine(), "build", "--network", "host", "--layers", "-q", "-f", str(containerfile), "-t", tag]
    argv += [f"--build-arg={k}={v}" for k, v in args.items()] + list(mounts) + [str(context)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise Unavailable(
            f"podman build of {tag} failed ({done.returncode}): {(done.stderr or done.stdout)[-2000:]}"
        )


def _drop_older(repository: str, keep: str) -> None:
    listed = _output([*_engine(), "images", "--format", "{{.Repository}}:{{.Tag}}", repository])
    for tag in listed.split():
        if tag != keep and tag.startswith(repository + ":"):
            subprocess.run([*_engine(), "rmi", tag], capture_output=True, timeout=120, check=False)


def _ensure(report: BuildReport, name: str, tag_base: str, digest: str, build: Callable[[str], None]) -> str:
    tag = f"{tag_base}:{digest}"
    if not image_exists(tag):
        started = time.monotonic()
        build(tag)
        report.seconds[name] = round(time.monotonic() - started, 1)
        report.built.append(tag)
        _drop_older(tag_base, tag)
    return tag


def build_images(base: str = DEFAULT_BASE) -> BuildReport:
    """The three images, built where their hash is new; the Debian base first if it is missing."""
    build_base(base)
    base_id = _image_id(base)
    report = BuildReport(images=Images(gyre="", nats="", postgres=""))
    with tempfile.TemporaryDirectory(prefix="gyre-compose-ctx-") as tmp:
        context = Path(tmp)
        dockerfile = (DEPLOY / "Dockerfile").read_text()
        for source in copied_sources(dockerfile):
            src = REPO / source
            if src.is_dir():
                shutil.copytree(src, context / source, ignore=IGNORED)
            else:
                shutil.copy2(src, context / source)
        (context / "deploy").mkdir()
        (context / "deploy" / "Dockerfile").write_text(dockerfile)
        mounts, pip_args = pip_mounts()
        args = {"BASE": base, "EXTRA_PACKAGES": EXTRA_PACKAGES, **pip_args}
        digest = tree_hash(context, [base_id, *sorted(f"{k}={v}" for k, v in args.items())])
        gyre = _ensure(
            report,
            "gyre",
            SERVICE_REPOSITORY,
            digest,
            lambda tag: _build(tag, context, context / "deploy" / "Dockerfile", args, mounts),
        )
    infra = {}
    local = DEPLOY / "local"
    for name in ("nats", "postgres"):
        containerfile = local / f"{name}.Containerfile"
        digest = tree_hash(local, [base_id, base, name])
        infra[name] = _ensure(
            report,
            name,
            f"{SERVICE_REPOSITORY}-{name}",
            digest,
            lambda tag, f=containerfile: _build(tag, local, f, {"BASE": base}, []),  # type: ignore[misc]
        )
    report.images = Images(gyre=gyre, nats=infra["nats"], postgres=infra["postgres"])
    return report
