# claude-proxy — the two commands a fresh machine needs: `make run` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENV_FILE ?= .env
# The Claude Code `make test` runs (tests/claude_code_pin.py reads this line), each version in
# its own folder so pins never collide; `make test-claude-latest` runs npm's `latest`.
CLAUDE_CODE_VERSION := 2.1.332
CLAUDE_CODE_DIR := .cache/claude-code-$(CLAUDE_CODE_VERSION)
CLAUDE_CODE_BINARY := node_modules/@anthropic-ai/claude-code-linux-x64/claude
CLAUDE_BIN := $(CLAUDE_CODE_DIR)/$(CLAUDE_CODE_BINARY)
CLAUDE_LATEST_DIR := .cache/claude-code-latest
export CLAUDE_BIN
# The JavaScript test clients (TypeScript SDK, Vercel AI SDK), pinned in tests/js/package.json
# and its lock file, installed under .cache/js; tests/js/node_modules points there so that the
# scripts in tests/js resolve them.
JS_CLIENTS_DIR := .cache/js
JS_CLIENTS := $(JS_CLIENTS_DIR)/.installed

CHROMIUM ?= $(shell command -v chromium 2>/dev/null || echo /usr/bin/chromium)
export CHROMIUM

.PHONY: run test test-claude-latest test-container lint typecheck unit bench bench-redis clean \
	browser shells redis soak fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $@ $(VENV)/.installed

$(CLAUDE_BIN):
	mkdir -p $(CLAUDE_CODE_DIR)
	npm install --prefix $(CLAUDE_CODE_DIR) --no-audit --no-fund --loglevel=error \
		@anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	test -x $(CLAUDE_BIN)

$(JS_CLIENTS): tests/js/package.json tests/js/package-lock.json
	mkdir -p $(JS_CLIENTS_DIR)
	cp tests/js/package.json tests/js/package-lock.json $(JS_CLIENTS_DIR)/
	npm ci --prefix $(JS_CLIENTS_DIR) --no-audit --no-fund --loglevel=error
	ln -sfn ../../$(JS_CLIENTS_DIR)/node_modules tests/js/node_modules
	touch $@

## browser: Debian's chromium for the dashboard's browser tests (driven by Playwright; its own
## browser download is not used)
browser:
	@test -x "$(CHROMIUM)" || { echo "installing chromium (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			chromium fonts-dejavu-core >/dev/null; } || \
		{ test -z "$$CI" && echo "warning: chromium could not be installed (not root?):" \
			"the dashboard's browser tests will be skipped"; }

## redis: Debian's redis-server for the shared-state tests (tests/test_shared_state.py start
## their own on a free loopback port, persistence off)
redis:
	@command -v redis-server >/dev/null 2>&1 || { echo "installing redis-server (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			redis-server >/dev/null; } || \
		{ test -z "$$CI" && echo "warning: redis-server could not be installed (not root?):" \
			"the shared-state tests will be skipped"; }

## shells: Debian's fish, so that the tests can evaluate `claude-proxy env --shell fish` (bash
## is there already)
shells:
	@command -v fish >/dev/null 2>&1 || { echo "installing fish (apt-get)"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
			fish >/dev/null; } || \
		{ test -z "$$CI" && echo "warning: fish could not be installed (not root?):" \
			"the fish test of claude-proxy env will be skipped"; }

## run: start the proxy with $(ENV_FILE) (e.g. `make run ENV_FILE=.env.kimi`)
run: $(VENV)/.installed
	$(BIN)/claude-proxy $(if $(wildcard $(ENV_FILE)),--env-file $(ENV_FILE),)

## test: lint, type-check and the whole test suite, Claude Code end-to-end tests included
test: $(VENV)/.installed-test $(CLAUDE_BIN) $(JS_CLIENTS) browser shells redis lint typecheck
	$(BIN)/python -m pytest

## test-claude-latest: the Claude Code tests against npm's `latest` (installed afresh into
## $(CLAUDE_LATEST_DIR)); for maintainers before each release, `make test` stays on the pin
test-claude-latest: $(VENV)/.installed-test
	mkdir -p $(CLAUDE_LATEST_DIR)
	npm install --prefix $(CLAUDE_LATEST_DIR) --no-audit --no-fund --loglevel=error \
		@anthropic-ai/claude-code@latest
	$(CLAUDE_LATEST_DIR)/$(CLAUDE_CODE_BINARY) --version
	CLAUDE_BIN=$(CLAUDE_LATEST_DIR)/$(CLAUDE_CODE_BINARY) $(BIN)/python -m pytest -m claude_code

## test-container: build the image with docker or podman, run it, check it from outside
test-container: $(VENV)/.installed-test
	$(BIN)/python -m tests.container

## soak: ten minutes of the whole fleet (2 replicas x 2 workers, one Redis, team keys and a
## budget) through its faults, then its figures; `make test` runs forty seconds of it
## (tests/test_soak.py). SOAK_SECONDS changes the length.
SOAK_SECONDS ?= 600
soak: $(VENV)/.installed-test redis
	$(BIN)/python -m tests.soak --seconds $(SOAK_SECONDS)

## fuzz: the hostile-input properties of tests/test_bad_input.py (mutated Claude Code requests,
## broken bytes, forged log lines) for FUZZ_SECONDS, fresh random examples each round; `make
## test` runs a fixed 1,500 of them
FUZZ_SECONDS ?= 600
fuzz: $(VENV)/.installed-test
	FUZZ_SECONDS=$(FUZZ_SECONDS) $(BIN)/python -m pytest tests/test_bad_input.py -p no:cacheprovider -q -s

## lint: ruff, and the import contracts of pyproject.toml (the layers of docs/development.md)
lint: $(VENV)/.installed-test
	$(BIN)/ruff check src tests
	$(BIN)/lint-imports

typecheck: $(VENV)/.installed-test
	$(BIN)/mypy src

## unit: the fast tests only (no Claude Code)
unit: $(VENV)/.installed-test $(JS_CLIENTS)
	$(BIN)/python -m pytest -m "not claude_code"

## bench: the proxy vs a direct baseline and a FLOOR translator, both run from a production
## install that the bench (re)builds in .cache/bench-prod-venv (`pip install .` only), and the
## team deployment (Redis, keys, OpenTelemetry) against the bare proxy; about 3 minutes
## (e.g. `make bench BENCH_ARGS="--compare-workers"`)
bench: $(VENV)/.installed-test redis
	$(BIN)/python -m bench $(BENCH_ARGS)

## bench-redis: CPU per request and added latency with REDIS_URL vs in-process state
bench-redis: $(VENV)/.installed-test redis
	$(BIN)/python -m bench.redis_column $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache
