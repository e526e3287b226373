# Two commands a fresh machine needs: `make dev` serves the kernel, `make test` runs every test.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

install: $(STAMP)

dev: $(STAMP)
	$(BIN)/regent dev

# The suite mostly waits on real servers (kernels, agents, PostgreSQL, a browser), so it runs in
# PYTEST_WORKERS processes, a test module to a process (--dist loadfile); PYTEST_WORKERS=0 runs it in one.
PYTEST_WORKERS ?= 3

test: $(STAMP)
	$(BIN)/ruff check kernel tests bench reliability
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/regent bench

# The reliability suite (docs/reliability.md); RELIABILITY_ARGS=--quick for the short profile.
reliability: $(STAMP)
	$(BIN)/regent chaos $(RELIABILITY_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check kernel tests bench reliability
	$(BIN)/mypy

.PHONY: install dev test bench reliability lint
