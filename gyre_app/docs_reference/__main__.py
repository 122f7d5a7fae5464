"""`python -m gyre_app.docs_reference [--check]`: write the generated reference pages (shell).

`--check` writes nothing and exits 1 naming each page that differs from what the code gives
now (a command, a setting or a contract changed without regenerating the docs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gyre_app.docs_reference import cli_pages, proto_pages, settings_pages

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference"


def pages() -> dict[str, str]:
    """File name under docs/reference/ -> its generated text."""
    from gyre_app.cli import SERVICE_COMMANDS, app

    descriptors = proto_pages.descriptor_set()
    texts = {
        "cli.md": cli_pages.render(app, {name: module for name, (module, _) in SERVICE_COMMANDS.items()}),
        "settings.md": settings_pages.render(),
        "events.md": proto_pages.render_events(descriptors),
        "rpcs.md": proto_pages.render_rpcs(descriptors),
    }
    return {name: text.rstrip("\n") + "\n" for name, text in texts.items()}


def stale_pages(folder: Path = REFERENCE, generated: dict[str, str] | None = None) -> list[str]:
    """The generated pages whose committed text differs from what the code gives now."""
    return sorted(
        name
        for name, text in (pages() if generated is None else generated).items()
        if not (folder / name).exists() or (folder / name).read_text() != text
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m gyre_app.docs_reference", description=__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is stale")
    ns = parser.parse_args(argv)
    if ns.check:
        stale = stale_pages()
        for name in stale:
            print(
                f"docs/reference/{name} is stale: run `python -m gyre_app.docs_reference`",
                file=sys.stderr,
            )
        return 1 if stale else 0
    REFERENCE.mkdir(parents=True, exist_ok=True)
    for name, text in pages().items():
        (REFERENCE / name).write_text(text)
        print(f"wrote docs/reference/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
