"""Read and reverse unified diffs as the importers need them (pure).

Example:
    diff_files("diff --git a/t/test_a.py b/t/test_a.py\\n--- a/t/test_a.py\\n+++ b/t/test_a.py\\n...")
    -> ["t/test_a.py"]
"""

from __future__ import annotations

import re

_GIT_HEADER = re.compile(r"^diff --git a/(.+?) b/(.+)$")
_HUNK = re.compile(r"^@@ -(\d+(?:,\d+)?) \+(\d+(?:,\d+)?) @@(.*)$")


def diff_files(patch: str) -> list[str]:
    """The paths a git diff changes (the new side; a deleted file's old path), in diff order."""
    files: list[str] = []
    for line in patch.splitlines():
        match = _GIT_HEADER.match(line)
        if match and match.group(2) not in files:
            files.append(match.group(2))
    return files


def reverse_patch(patch: str) -> str:
    """The diff that undoes `patch`: sides, hunk ranges, added and removed lines swapped.

    SWE-smith rows carry the patch that *introduced* the bug; its reverse is the fix.

    Example:
        "--- a/x.py\\n+++ b/x.py\\n@@ -1,2 +1,2 @@\\n-good\\n+bad\\n ctx\\n"
        -> "--- a/x.py\\n+++ b/x.py\\n@@ -1,2 +1,2 @@\\n-bad\\n+good\\n ctx\\n"
    """
    out: list[str] = []
    removed: list[str] = []  # one change run: its lines, each with a "\\ No newline" note if any
    added: list[str] = []
    last: list[str] | None = None

    def flush() -> None:
        nonlocal last
        out.extend(removed + added)
        removed.clear()
        added.clear()
        last = None

    lines = patch.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("+") and not line.startswith("+++ "):
            removed.append("-" + line[1:])
            last = removed
        elif line.startswith("-") and not line.startswith("--- "):
            added.append("+" + line[1:])
            last = added
        elif line.startswith("\\") and last is not None:
            last[-1] += "\n" + line  # the note belongs to the line before it
        else:
            flush()
            i += _reverse_header(lines, i, out)
            continue
        i += 1
    flush()
    return "\n".join(out)


def _reverse_header(lines: list[str], i: int, out: list[str]) -> int:
    """Reverse the non-change line at `i` (two for ---/+++ and rename pairs); returns lines used."""
    line = lines[i]
    after = lines[i + 1] if i + 1 < len(lines) else ""
    header = _GIT_HEADER.match(line)
    hunk = _HUNK.match(line)
    if header:
        out.append(f"diff --git a/{header.group(2)} b/{header.group(1)}")
    elif line.startswith("--- ") and after.startswith("+++ "):
        out += [f"--- {_side(after[4:], 'a/')}", f"+++ {_side(line[4:], 'b/')}"]
        return 2
    elif line.startswith("new file mode "):
        out.append("deleted file mode " + line.removeprefix("new file mode "))
    elif line.startswith("deleted file mode "):
        out.append("new file mode " + line.removeprefix("deleted file mode "))
    elif line.startswith("rename from ") and after.startswith("rename to "):
        out += [
            "rename from " + after.removeprefix("rename to "),
            "rename to " + line.removeprefix("rename from "),
        ]
        return 2
    elif line.startswith("old mode ") and after.startswith("new mode "):
        out += ["old mode " + after.removeprefix("new mode "), "new mode " + line.removeprefix("old mode ")]
        return 2
    elif line.startswith("index ") and ".." in line:
        parts = line.split(" ")
        old, new = parts[1].split("..", 1)
        out.append(" ".join(["index", f"{new}..{old}", *parts[2:]]))
    elif hunk:
        out.append(f"@@ -{hunk.group(2)} +{hunk.group(1)} @@{hunk.group(3)}")
    else:
        out.append(line)
    return 1


def _side(path: str, prefix: str) -> str:
    """`a/x` <-> `b/x` when the sides swap; /dev/null stays."""
    if path == "/dev/null" or path.startswith("/dev/null"):
        return path
    if path[:2] in ("a/", "b/"):
        return prefix + path[2:]
    return path
