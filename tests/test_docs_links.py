"""The README and docs/ link only to files that exist inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
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
    # The tutorials are the README's "where to go next": each is one click away.
    for page in sorted((ROOT / "docs" / "tutorials").glob("*.md")):
        assert page.resolve() in linked, page.name


def test_the_readme_is_a_guide_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert len(readme.splitlines()) <= 300  # depth lives in docs/, not here
