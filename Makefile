# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck proto up down clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/gyre demo --learn

test: $(STAMP) lint typecheck
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check gyre gyre_app services tests bench
	$(BIN)/ruff format --check gyre gyre_app services tests bench

typecheck: $(STAMP)
	$(BIN)/mypy gyre gyre_app services

proto: $(STAMP)
	$(BIN)/python -m gyre.codegen

up: $(STAMP)
	$(BIN)/gyre up

down: $(STAMP)
	$(BIN)/gyre down

clean:
	-$(BIN)/gyre down --all
	rm -rf $(VENV) .gyre .pytest_cache .mypy_cache .ruff_cache
