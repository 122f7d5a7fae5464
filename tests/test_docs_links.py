"""The README and docs/ link only to files that exist inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        resolved = (page.parent / target).resolve()
        if not resolved.is_relative_to(ROOT) or not resolved.exists():
            broken.append(target)
    assert broken == []


def test_the_readme_links_the_docs() -> None:
    readme = ROOT / "README.md"
    linked = {(ROOT / t).resolve() for t in LINK.findall(readme.read_text())}
    for page in ("architecture", "contracts", "operations", "ownership"):
        assert (ROOT / "docs" / f"{page}.md").resolve() in linked, page
