"""Reference pages of the docs site, generated from the code that is their source of truth.

`python -m gyre_app.docs_reference` writes `docs/reference/{cli,settings,events,rpcs}.md`: the
CLI from the `gyre` command's own parsers (`cli_pages`), the settings from the pydantic-settings
classes (`settings_pages`), the events and RPCs from `proto/` with their comments
(`proto_pages`). `--check` writes nothing and fails when a committed page differs.
"""
