# Two set-up commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Two installs, two stamps: `run` needs the runtime dependencies only, `test`/`lint` the test extras too.
RUN_STAMP := $(VENV)/.installed-run
TEST_STAMP := $(VENV)/.installed-test
ARGS ?=

.PHONY: venv run test test-fast conformance lint bench demo clean redis-server chromium

# The Tasks-capable upstream for tests/test_upstream_with_tasks.py (pinned; node_modules is git-ignored).
SERVER_EVERYTHING := @modelcontextprotocol/server-everything@2026.8.31

# Which interpreter a Python is: "<version> <base prefix> <3.11+?>" (a venv's Python names the one it was
# made from). Checked for every goal but clean: PYTHON must be 3.11+, and a .venv made by another
# interpreter (an older Python, or not the one PYTHON names) is made again, saying so in one line.
IDENTIFY := import sys; print(".".join(map(str, sys.version_info[:3])), sys.base_prefix, sys.version_info >= (3, 11))
ifneq ($(filter-out clean node_modules,$(or $(MAKECMDGOALS),venv)),)
WANT := $(shell $(PYTHON) -c '$(IDENTIFY)' 2>/dev/null)
ifeq ($(WANT),)
$(error $(PYTHON) does not run: install Python 3.11+ or pass PYTHON=/path/to/python3.11)
endif
ifneq ($(word 3,$(WANT)),True)
$(error $(PYTHON) is Python $(word 1,$(WANT)); the gateway needs 3.11+: pass PYTHON=/path/to/python3.11)
endif
ifneq ($(wildcard $(VENV)),)
HAVE := $(shell $(BIN)/python -c '$(IDENTIFY)' 2>/dev/null)
ifneq ($(HAVE),$(WANT))
ifeq ($(HAVE),)
$(info make: $(VENV)/bin/python does not start; recreating $(VENV) with $(PYTHON) (Python $(word 1,$(WANT))))
else ifneq ($(word 3,$(HAVE)),True)
$(info make: $(VENV) runs Python $(word 1,$(HAVE)), older than 3.11; recreating it with $(PYTHON) (Python $(word 1,$(WANT))))
else
$(info make: $(VENV) runs Python $(word 1,$(HAVE)) from $(word 2,$(HAVE)), not $(PYTHON) (Python $(word 1,$(WANT)) from $(word 2,$(WANT))); recreating it)
endif
ifneq (n,$(findstring n,$(firstword -$(MAKEFLAGS))))
$(shell rm -rf $(VENV))
endif
endif
endif
endif

venv: $(BIN)/python

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(RUN_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(TEST_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(TEST_STAMP)

# `exec`: the gateway replaces the recipe's shell, so it is make's own child. GNU make passes a SIGTERM
# on to its children (and Ctrl-C's SIGINT reaches the whole foreground process group): either way the
# signal reaches the gateway, which stops its upstreams and exits. Without `exec`, only the shell would
# get make's SIGTERM and the gateway would go on running, orphaned.
run: $(RUN_STAMP)
	exec $(BIN)/mcp-task-gateway serve --config config/gateway.example.toml --upstream-cmd "$(abspath $(BIN))/python examples/build_server.py" $(ARGS)

node_modules: node_modules/@modelcontextprotocol/server-everything tests/oidc/node_modules/oidc-provider tests/official_suite/node_modules/@modelcontextprotocol/conformance

node_modules/@modelcontextprotocol/server-everything:
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is not on PATH; install Node.js 20+ and npm (tests/test_upstream_with_tasks.py runs $(SERVER_EVERYTHING))" >&2; exit 1; }
	npm install --no-save --no-audit --no-fund --prefix "$(CURDIR)" $(SERVER_EVERYTHING)

# The authorization server of tests/test_auth_oidc.py: npm oidc-provider, exactly as tests/oidc/package-lock.json pins it.
tests/oidc/node_modules/oidc-provider: $(wildcard tests/oidc/package-lock.json)
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is not on PATH; install Node.js 20+ and npm (tests/test_auth_oidc.py runs oidc-provider)" >&2; exit 1; }
	npm ci --no-audit --no-fund --prefix "$(CURDIR)/tests/oidc"

# The official MCP conformance suite of tests/test_official_suite.py (@modelcontextprotocol/conformance
# 0.2.0-alpha.12), exactly as tests/official_suite/package-lock.json pins it, in a folder of its own: it
# needs Node 22+ (npm `node` 22 comes with it; the machine's Node 20 is left alone), and an `npm install
# --no-save` into the top node_modules would remove the server-everything installed there.
tests/official_suite/node_modules/@modelcontextprotocol/conformance: $(wildcard tests/official_suite/package-lock.json)
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is not on PATH; install Node.js 20+ and npm (tests/test_official_suite.py runs the official conformance suite)" >&2; exit 1; }
	npm ci --no-audit --no-fund --prefix "$(CURDIR)/tests/official_suite"

# The Redis store's tests start their own redis-server (tests/redis_server.py), never the machine's:
# install Debian's package when there is none (as root, or through sudo).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "make: redis-server is not on PATH; install Redis 7 (the store tests start their own)" >&2; exit 1; }; \
	  if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; }

# The /ui page's browser tests (tests/test_ui_browser.py) drive Debian's chromium through Playwright, which
# downloads no browser of its own: install the package when /usr/bin/chromium is missing (as root, or
# through sudo).
chromium:
	@test -x /usr/bin/chromium || { \
	  command -v apt-get >/dev/null 2>&1 || { echo "make: /usr/bin/chromium is missing; install Chromium there (the browser tests drive it)" >&2; exit 1; }; \
	  if [ "$$(id -u)" = 0 ]; then sudo=; else sudo=sudo; fi; \
	  $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# `$(call timed,COMMAND)`: COMMAND, then the goal's wall time in one line, keeping COMMAND's exit status
# (plain /bin/sh: `date +%s` and shell arithmetic).
timed = @$(info $(1))start=$$(date +%s); $(1); status=$$?; \
	echo "make $@: $$(($$(date +%s) - start)) s"; exit $$status

# Two pytest-xdist workers, one test module each (modules share fixtures; the tests mostly wait on
# the processes they start): `make test WORKERS=0` runs everything in one process.
WORKERS ?= 2

test: $(TEST_STAMP) node_modules redis-server chromium
	$(call timed,$(BIN)/python -m pytest -q -n $(WORKERS) --dist loadfile $(ARGS))

# The fast lane: the tests that start no process (see tests/conftest.py, --in-process), on two
# pytest-xdist workers (they are CPU-bound: one per core); about a minute.
test-fast: $(TEST_STAMP)
	$(call timed,$(BIN)/python -m pytest -q --in-process -n 2 $(ARGS))

# The conformance kit against the gateway in front of the example server (both eras), as CI runs it:
# reports/conformance.junit.xml, and a failure when a check fails (see docs/conformance.md).
conformance: $(RUN_STAMP)
	.ci/conformance

lint: $(TEST_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

bench: $(TEST_STAMP)
	$(BIN)/python bench/forwarding.py $(ARGS)

demo: $(RUN_STAMP)
	exec $(BIN)/mcp-task-gateway demo $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache reports
