"""Build OCI images without a registry: a Debian base from Debian's packages, task images on it (shell).

`build_base` runs `mmdebstrap` (a minimal Debian root with python3, pytest, git and patch) and
`podman import`s it; only Debian's package mirror is needed, never an image registry. A task
image is `FROM` that base with a repository committed at its workdir (`build_repo_image`), the
shape SWE-bench images have. Both skip the work when the tag is already in the local store.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from gyre.errors import InvalidArgument, Unavailable
from gyre.sandbox.oci import find_engine

DEFAULT_BASE = "localhost/gyre-python-base:bookworm"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-pytest", "git", "patch", "ca-certificates")
BUILD_TIMEOUT_S = 1800


def _engine() -> list[str]:
    engine = find_engine()
    if engine is None:
        raise Unavailable("no container engine: install podman and runc (apt-get install -y podman runc)")
    return engine


def image_exists(tag: str) -> bool:
    done = subprocess.run([*_engine(), "image", "exists", tag], capture_output=True, check=False)
    return done.returncode == 0


def build_base(tag: str = DEFAULT_BASE, *, mirror: str = MIRROR, packages: Sequence[str] = PACKAGES) -> bool:
    """Build the base image under `tag`; False when it already existed (nothing built)."""
    if not tag or any(c.isspace() for c in tag):
        raise InvalidArgument("tag", f"must be an image name without spaces, got {tag!r}")
    if image_exists(tag):
        return False
    if shutil.which("mmdebstrap") is None:
        raise Unavailable("mmdebstrap is not installed (apt-get install -y mmdebstrap)")
    with tempfile.TemporaryDirectory(prefix="gyre-base-") as tmp:
        rootfs = Path(tmp) / "rootfs.tar"
        _check(
            [
                "mmdebstrap",
                "--variant=minbase",
                f"--include={','.join(packages)}",
                # No apt lists or caches in the image; a task image installs nothing at run time.
                "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*",
                SUITE,
                str(rootfs),
                mirror,
            ],
            what="mmdebstrap",
        )
        _check(
            [
                *_engine(),
                "import",
                "--change",
                "ENV=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "WORKDIR=/",
                "--change",
                'CMD=["/bin/bash"]',
                str(rootfs),
                tag,
            ],
            what="podman import",
        )
    return True


def build_repo_image(
    *, base: str, tag: str, repo: Path, workdir: str = "/testbed", rebuild: bool = False
) -> bool:
    """`FROM base`, the files of `repo` committed as one git commit at `workdir`; False when the
    tag existed and `rebuild` is off. Returns after the image is in the local store."""
    if not rebuild and image_exists(tag):
        return False
    if not image_exists(base):
        raise InvalidArgument(
            "base", f"image {base!r} is not present: build it with `gyre images base --tag {base}`"
        )
    with tempfile.TemporaryDirectory(prefix="gyre-taskimg-") as tmp:
        context = Path(tmp)
        shutil.copytree(repo, context / "repo", ignore=shutil.ignore_patterns(".git", "__pycache__"))
        (context / "Containerfile").write_text(
            f"FROM {base}\n"
            f"COPY repo {workdir}\n"
            f"WORKDIR {workdir}\n"
            "RUN git init -q && git config user.email gyre@localhost && git config user.name gyre"
            " && git add -A && git commit -q -m base\n"
        )
        _check(
            [
                *_engine(),
                "build",
                "--network",
                "none",
                "-q",
                "-t",
                tag,
                "-f",
                str(context / "Containerfile"),
                str(context),
            ],
            what="podman build",
        )
    return True


def _check(argv: Sequence[str], *, what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise Unavailable(f"{what} failed ({done.returncode}): {(done.stderr or done.stdout)[-1500:]}")
