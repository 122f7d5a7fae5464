"""The generated reference pages in docs/reference/ are what the code gives now."""

from __future__ import annotations

import argparse

import pytest

from gyre_app.cli import SERVICE_COMMANDS
from gyre_app.docs_reference import cli_pages, settings_pages
from gyre_app.docs_reference.__main__ import REFERENCE, pages, stale_pages


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return pages()


def test_the_committed_reference_pages_are_current(generated: dict[str, str]) -> None:
    # Fails after a command, a setting or a proto comment changed: run `make reference`.
    assert stale_pages(REFERENCE, generated) == []


def test_a_changed_page_is_reported_stale(tmp_path, generated: dict[str, str]) -> None:
    for name, text in generated.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "settings.md").write_text("# edited by hand\n")
    assert stale_pages(tmp_path, generated) == ["settings.md"]


def test_every_command_has_a_section_with_its_own_options() -> None:
    text = (REFERENCE / "cli.md").read_text()
    for name in ("up", "down", "demo", "submit", "status", "staleness", "report", *SERVICE_COMMANDS):
        assert f"## `gyre {name}`" in text, name
    # Service commands are documented by their own parser, not by the forwarding stub.
    assert "usage: gyre sim" in text and "--ablation" in text
    assert "usage: gyre tasks generate" in text and "--family FAMILY" in text


def test_every_settings_field_is_listed_with_its_variable() -> None:
    text = (REFERENCE / "settings.md").read_text()
    for cls in settings_pages.settings_classes():
        prefix = str(cls.model_config.get("env_prefix", ""))
        for field in cls.model_fields:
            assert f"`{prefix}{field}`".upper() in text.upper(), f"{prefix}{field}"


def test_every_event_and_rpc_of_proto_is_listed() -> None:
    from gyre_app.docs_reference.proto_pages import descriptor_set

    events = (REFERENCE / "events.md").read_text()
    rpcs = (REFERENCE / "rpcs.md").read_text()
    for file in descriptor_set().file:
        if not file.name.startswith("gyre/"):
            continue
        page = events if file.name.endswith("/events.proto") or file.package == "gyre.common.v1" else rpcs
        for message in file.message_type:
            assert f"`{file.package}.{message.name}`" in page, message.name
        for service in file.service:
            for method in service.method:
                assert f"| `{method.name}` |" in rpcs, method.name


def test_a_parser_is_captured_before_it_parses() -> None:
    ran = []

    def main(argv: list[str]) -> int:
        parser = argparse.ArgumentParser(prog="gyre example")
        parser.add_argument("--flag")
        parser.parse_args(argv)
        ran.append(True)
        return 0

    parser = cli_pages.captured_parser(main)
    assert parser.prog == "gyre example" and ran == []
