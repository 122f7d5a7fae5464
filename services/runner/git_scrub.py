"""Remove a repository's future before an agent sees it (shell around one script run in the container).

A dataset image often holds more of its repository than the base commit: the upstream remote,
tags of later releases, other branches, a reflog, packed refs and loose objects that contain
the very fix the task asks for. An agent that runs `git log --all` or `git show <tag>` would
read the answer. Before the agent starts, the runner leaves only the base commit and its
ancestors: the current branch is pointed at the base, every other ref, tag, remote, stash and
reflog is deleted, and everything unreachable is pruned. The script then checks that every
commit left is an ancestor of the base, and fails otherwise, so a task never starts with its
future in reach.
"""

from __future__ import annotations

from gyre.sandbox.backend import SandboxBox

SCRUB_TIMEOUT_S = 300.0
SCRIPT = r"""
set -eu
cd "$1"
git rev-parse --git-dir >/dev/null 2>&1 || { echo "gyre-scrub: not a git repository"; exit 0; }
base=$(git rev-parse --verify "${2:-HEAD}^{commit}")
branch=$(git symbolic-ref -q --short HEAD || echo gyre-base)
git -c advice.detachedHead=false checkout -q --detach "$base"
git for-each-ref --format='%(refname)' | while read -r ref; do git update-ref -d "$ref"; done
git checkout -q -B "$branch" "$base"
for remote in $(git remote); do git remote remove "$remote"; done
git stash clear 2>/dev/null || true
gitdir=$(git rev-parse --git-dir)
rm -rf "$gitdir/logs" "$gitdir/ORIG_HEAD" "$gitdir/FETCH_HEAD" "$gitdir/MERGE_HEAD" "$gitdir/refs/original"
rm -f "$gitdir/packed-refs.lock"
git reflog expire --expire=now --all
git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.pruneExpire=now gc -q --prune=now
left=$(git rev-list --all | wc -l)
mine=$(git rev-list "$base" | wc -l)
if [ "$left" != "$mine" ] || [ -n "$(git tag -l)" ] || [ -n "$(git remote)" ]; then
  echo "gyre-scrub: future state left: $left commits reachable, $mine from the base"; exit 1
fi
unreachable=$(git fsck --unreachable --no-reflogs 2>/dev/null | wc -l)
[ "$unreachable" = 0 ] || { echo "gyre-scrub: $unreachable unreachable objects left"; exit 1; }
echo "gyre-scrub: $mine commits kept on $branch at $base"
"""


class ScrubFailed(Exception):
    """The repository could not be cut back to its base (a machinery failure: never start it)."""


async def scrub_future_history(box: SandboxBox, *, workdir: str, base_commit: str = "") -> str:
    """Run the scrub in `workdir` of `box` (base: `base_commit`, or HEAD); its last line."""
    done = await box.exec(["sh", "-c", SCRIPT, "gyre-scrub", workdir, base_commit], timeout_s=SCRUB_TIMEOUT_S)
    text = done.output.decode(errors="replace").strip()
    if done.exit_code != 0:
        raise ScrubFailed(f"scrubbing the repository's future failed ({done.exit_code}): {text[-800:]}")
    return text.splitlines()[-1] if text else ""
