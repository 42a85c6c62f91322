# Every target bootstraps .venv (Python >= 3.11) with the extras it needs.
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && echo $$p && break; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test test-k8s lint bench bench-check fmt clean web web-test helm bytecode

# The web UI (web/: Preact + TypeScript, built by Vite into the package, where `loopd up` serves it). `npm ci` runs
# when the lockfile changes, the build when a source, the page or a config does.
WEB := web
WEB_DEPS := $(WEB)/node_modules/.loopd-installed
WEB_BUILD := src/loopd/server/webui/dist/index.html
WEB_SOURCES := $(shell find $(WEB)/src $(WEB)/public -type f 2>/dev/null) \
	$(wildcard $(WEB)/index.html $(WEB)/package.json $(WEB)/vite.config.* $(WEB)/tsconfig*.json)

$(BIN)/python:
	@test -n "$(PYTHON)" || { echo "Python >= 3.11 is required"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,k8s,otel]'
	@touch $@

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,k8s,otel,bench]'
	@touch $@

$(WEB_DEPS): $(WEB)/package.json $(WEB)/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "Node.js and npm are required to build the web UI"; exit 1; }
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

$(WEB_BUILD): $(WEB_SOURCES) $(WEB_DEPS)
	cd $(WEB) && npm run build --silent
	@touch $@

web: $(WEB_BUILD)

# The page's unit tests (vitest): the reducer, the revision merge, the parallel layout, the rendering.
web-test: $(WEB_DEPS)
	cd $(WEB) && npm test --silent

# Bytecode of the project's own modules, written ahead (fast when up to date). Where PYTHONDONTWRITEBYTECODE is set,
# no process writes it, so every `loopd` process a command or a test starts would compile loopd's sources again
# (≈ 0.7 s of CPU each on a small machine).
bytecode: $(STAMP)
	$(BIN)/python -m compileall -q src benchmarks

run: $(STAMP) web bytecode
	$(BIN)/loopd up $(RUN_ARGS)

# The suite runs in more workers than cores (pytest-xdist; PYTEST_WORKERS=0 for one process, e.g. to debug a test):
# many tests wait on other processes (servers starting, a browser, kill -9 and restart), so on 2 cores 4 workers
# finish in ≈ 6 min where 2 take ≈ 8.5 min at the same CPU. Twice the cores, at most cores + 4.
# Tests wait for conditions, never for durations: their real-time guards only bound a hang, so a loaded machine
# makes the suite slower, not red.
CORES := $(shell nproc 2>/dev/null || echo 2)
PYTEST_WORKERS ?= $(shell c=$(CORES); w=$$((2 * c)); m=$$((c + 4)); echo $$(( w < m ? w : m )))

# The chart's tests (tests/deploy) run the real helm: built from its Go module on the first run, then cached.
helm: $(STAMP)
	$(BIN)/python scripts/k8s_tools.py ensure helm

# The suite lets pytest keep its rewritten test modules (git-ignored __pycache__) whatever PYTHONDONTWRITEBYTECODE
# says: each worker imports all of them, ≈ 15 s of CPU per worker saved on a small machine.
SUITE_ENV := PYTHONDONTWRITEBYTECODE=

test: $(STAMP) web web-test helm bytecode
	$(SUITE_ENV) $(BIN)/python -m pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

# The tests against a real kube-apiserver + etcd (tests/k8s, collected only with LOOPD_K8S=1): the binaries are
# built from their Go modules on the first run and cached by version (scripts/k8s_tools.py); one process, one cluster.
test-k8s: $(STAMP) bytecode
	$(BIN)/python scripts/k8s_tools.py ensure
	$(SUITE_ENV) LOOPD_K8S=1 $(BIN)/python -m pytest -n 0 tests/k8s $(PYTEST_ARGS)

# With the bench extra: mypy checks benchmarks/ against the libraries its peers use (LangGraph, the Agents SDK).
lint: $(BENCH_STAMP)
	$(BIN)/ruff check src tests benchmarks scripts
	$(BIN)/ruff format --check src tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/lint-imports

fmt: $(STAMP)
	$(BIN)/ruff format src tests benchmarks
	$(BIN)/ruff check --fix src tests benchmarks

# writes benchmarks/results/<date>-<sha>.json and regenerates docs/BENCHMARKS.md's generated sections from it.
# LangGraph's Agent Server (the peer of server_chats and server_streams) gets a virtualenv of its own under
# ${XDG_CACHE_HOME:-~/.cache}/loopd/bench-langgraph: langgraph-api needs an older jsonschema_rs than the dev extra's
# schemathesis. Installed once, again only when its pins (benchmarks/_langgraph.py) change.
bench: $(BENCH_STAMP) web bytecode
	$(BIN)/python -m benchmarks._langgraph ensure
	$(BIN)/python -m benchmarks --results --docs $(BENCH_ARGS)

# the quick benchmarks against the last committed results of this machine class (benchmarks/tolerances.toml);
# exit 1 on a regression. Not part of `make test`.
bench-check: $(BENCH_STAMP) bytecode
	$(BIN)/python -m benchmarks._check $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache $(WEB)/node_modules src/loopd/server/webui/dist
