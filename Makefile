# Two set-up commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
ARGS ?=

.PHONY: run test lint bench demo clean

# The Tasks-capable upstream for tests/test_upstream_with_tasks.py (pinned; node_modules is git-ignored).
SERVER_EVERYTHING := @modelcontextprotocol/server-everything@2026.8.31

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/mcp-task-gateway serve --config config/gateway.example.toml --upstream-cmd "$(abspath $(BIN))/python examples/build_server.py" $(ARGS)

node_modules: node_modules/@modelcontextprotocol/server-everything

node_modules/@modelcontextprotocol/server-everything:
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is not on PATH; install Node.js 20+ and npm (tests/test_upstream_with_tasks.py runs $(SERVER_EVERYTHING))" >&2; exit 1; }
	npm install --no-save --no-audit --no-fund --prefix "$(CURDIR)" $(SERVER_EVERYTHING)

test: $(STAMP) node_modules
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python bench/forwarding.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
