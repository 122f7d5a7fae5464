"""Copying and removing trees a sandbox user shaped (gyre/sandbox/trees.py): links stay links,
nothing but folders, files and links is copied, every bound holds, depth never crashes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.escape_paths import deep_chain
from gyre.sandbox.trees import CopyBounds, CopyRefused, bounded_copy, remove_tree


@pytest.fixture
def trees(tmp_path: Path) -> tuple[Path, Path]:
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    dest.mkdir()
    return src, dest


def test_files_and_folders_are_copied_and_links_stay_links(trees: tuple[Path, Path], tmp_path: Path) -> None:
    src, dest = trees
    (src / "pkg").mkdir()
    (src / "pkg" / "a.py").write_text("x = 1\n")
    secret = tmp_path / "secret"
    secret.write_text("host only")
    os.symlink(secret, src / "evil")
    assert bounded_copy(src, dest, CopyBounds()) == len("x = 1\n")
    assert (dest / "pkg" / "a.py").read_text() == "x = 1\n"
    assert os.readlink(dest / "evil") == str(secret)  # the link, never the host file's content


def test_fifos_are_skipped_so_nothing_blocks_the_copy(trees: tuple[Path, Path]) -> None:
    src, dest = trees
    os.mkfifo(src / "pipe")
    bounded_copy(src, dest, CopyBounds())
    assert not (dest / "pipe").exists()


@pytest.mark.parametrize(
    ("bounds", "why"),
    [
        (CopyBounds(max_files=3), "more than 3 files"),
        (CopyBounds(max_bytes=10), "more than 0 MiB"),
        (CopyBounds(deadline=0.0), "deadline"),
    ],
)
def test_each_bound_refuses_with_its_reason(trees: tuple[Path, Path], bounds: CopyBounds, why: str) -> None:
    src, dest = trees
    for i in range(5):
        (src / f"f{i}").write_text("0123456789")
    with pytest.raises(CopyRefused, match=why):
        bounded_copy(src, dest, bounds)


def test_a_chain_deeper_than_allowed_is_refused_and_removed_without_recursion(
    trees: tuple[Path, Path],
) -> None:
    src, dest = trees
    deep_chain(src, 1100)
    with pytest.raises(CopyRefused, match="deeper than 64"):
        bounded_copy(src, dest, CopyBounds())
    remove_tree(src)
    remove_tree(dest)
    assert not src.exists() and not dest.exists()
