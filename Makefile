# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck docs reference proto up down clean compose-smoke

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/gyre demo --learn

test: $(STAMP) lint typecheck docs
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check gyre gyre_app services tests bench
	$(BIN)/ruff format --check gyre gyre_app services tests bench

typecheck: $(STAMP)
	$(BIN)/mypy gyre gyre_app services

# The site, built strictly so a broken link fails; the generated reference pages must be current.
docs: $(STAMP)
	$(BIN)/python -m gyre_app.docs_reference --check
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# Regenerate docs/reference/ (CLI, settings, events, RPCs) after changing any of them.
reference: $(STAMP)
	$(BIN)/python -m gyre_app.docs_reference

proto: $(STAMP)
	$(BIN)/python -m gyre.codegen

# deploy/docker-compose.yml up with Podman and podman-compose, the quick demo against it, down.
# The images are built here (Debian packages, this machine's pip) and reused while unchanged.
# Minutes (about 5 warm, 13 cold on two cores): too long for `make test`, which skips it.
compose-smoke: $(STAMP)
	GYRE_COMPOSE_SMOKE=1 $(BIN)/python -m pytest -p no:cacheprovider -ra tests/deploy/test_compose_smoke.py

up: $(STAMP)
	$(BIN)/gyre up

down: $(STAMP)
	$(BIN)/gyre down

clean:
	-$(BIN)/gyre down --all
	rm -rf $(VENV) .gyre .pytest_cache .mypy_cache .ruff_cache site
