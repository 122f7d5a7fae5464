"""Before an agent starts, its repository keeps only the base commit's past (live, Podman)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gyre.sandbox.backend import ContainerLimits
from gyre.sandbox.oci import OciBackend, find_engine
from gyre_app.images import DEFAULT_BASE, build_base
from services.runner.git_scrub import scrub_future_history

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_engine() is None, reason="no container engine (.ci/run installs podman and runc)"
    ),
]
# A repository with a future: a fix committed after the base, a release tag, an upstream remote
# with its own ref, a stash and a dangling commit, as dataset images often carry.
MAKE_REPO = r"""
set -e
mkdir -p /testbed && cd /testbed && git init -q && git config user.email a@b && git config user.name a
echo bug > f.py && git add f.py && git commit -qm base
echo fix > f.py && git commit -qam "the fix" && git tag v2 && git rev-parse HEAD > /future
git branch later && git remote add origin https://example.invalid/r.git
git update-ref refs/remotes/origin/main HEAD
git reset -q --hard HEAD~1
echo wip > g.py && git add g.py && git stash -q
git commit-tree -m dangling "$(git write-tree)" -p HEAD > /dangling
"""
PROBE = r"""
cd /testbed
echo "log: $(git log --all --format=%s | tr '\n' ' ')"
echo "tags: $(git tag -l | wc -l) remotes: $(git remote | wc -l) refs: $(git for-each-ref | wc -l)"
git cat-file -e "$(cat /future)" 2>/dev/null && echo "future: present" || echo "future: gone"
git cat-file -e "$(cat /dangling)" 2>/dev/null && echo "dangling: present" || echo "dangling: gone"
echo "tree: $(cat f.py)"
"""


def test_future_commits_tags_remotes_and_loose_objects_are_gone() -> None:
    async def run() -> tuple[str, str]:
        build_base(DEFAULT_BASE)
        box = await OciBackend().create(
            name=f"gyre-scrub-{uuid.uuid4().hex[:8]}",
            image=DEFAULT_BASE,
            limits=ContainerLimits(memory_mb=512),
        )
        try:
            made = await box.exec(["sh", "-c", MAKE_REPO], timeout_s=60)
            assert made.exit_code == 0, made.output
            said = await scrub_future_history(box, workdir="/testbed")
            probe = await box.exec(["sh", "-c", PROBE], timeout_s=60)
            return said, probe.output.decode()
        finally:
            await box.close()

    said, probe = asyncio.run(run())
    assert said.startswith("gyre-scrub: 1 commits kept")
    assert probe.splitlines() == [
        "log: base ",
        "tags: 0 remotes: 0 refs: 1",
        "future: gone",
        "dangling: gone",
        "tree: bug",
    ]
