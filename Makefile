# evalstream: `make demo` runs the main job, `make test` runs the tests.
# Everything runs as local processes (no Docker needed); data, pid files and logs live in
# $(STACK) (default .stack/), installs are cached in ~/.cache/evalstream.
SHELL := /bin/bash
PY := .venv/bin/python
WORKERS ?= 1
ROUTERS ?= 1
AGGREGATORS ?= 1
STACK ?= $(CURDIR)/.stack
export EVALSTREAM_STACK := $(STACK)

.PHONY: venv up up-infra down ps clean demo test test-unit test-faults down-faults bench lint lock help

help:
	@echo "make demo        stack up + the bundled sample set through the default model, report printed"
	@echo "make test        stack up (installing on first use) + the test suite, fault scenarios scaled down"
	@echo "make test-faults the fault-injection scenarios at full size (long)"
	@echo "make bench       benchmarks, JSON into bench/results/"
	@echo "make up|down|ps|clean   the local stack (WORKERS=n ROUTERS=n AGGREGATORS=n make up); folder: $(STACK)"
	@echo "make up HOSTS=n  the workers on n network-namespace hosts, a worker group each (root; HOSTS=0: back)"
	@echo "make lint        ruff + mypy"

# The virtual environment lives in a cache keyed by requirements.lock; .venv links to it.
venv:
	@bash ops/local/venv.sh >/dev/null

up: venv
	@$(PY) ops/local/stack.py up --workers $(WORKERS) --routers $(ROUTERS) --aggregators $(AGGREGATORS) $(if $(HOSTS),--hosts $(HOSTS))

up-infra: venv
	@$(PY) ops/local/stack.py up --infra-only

down:
	@python3 ops/local/stack.py down

ps:
	@python3 ops/local/stack.py ps

clean:
	@python3 ops/local/stack.py clean

# Clients authenticate: `stack.py env` gives them the stack's endpoints and the users' credentials.
CLIENT_ENV = eval "$$($(PY) ops/local/stack.py env)"

demo: up
	@$(CLIENT_ENV) && .venv/bin/evalctl submit services/producer/evalstream/producer/samples/demo.jsonl --name demo --wait
	@$(CLIENT_ENV) && .venv/bin/evalctl submit services/producer/evalstream/producer/samples/demo_code.jsonl --name demo-code --max-tokens 200 --wait

# The whole suite: the development stack's tests, then every fault scenario scaled down
# (FAULTS_CI_SCALE) on the fault stack, which is brought up for it and down after it.
FAULTS_CI_SCALE ?= 0.2
test: up
	@$(CLIENT_ENV) && $(PY) -m pytest -m "not slow and not faults and not hosts" $(PYTEST_ARGS)
	@$(MAKE) --no-print-directory test-faults FAULTS_SCALE=$(FAULTS_CI_SCALE); rc=$$?; \
	  $(MAKE) --no-print-directory down-faults; exit $$rc

test-unit: venv
	@$(PY) -m pytest tests/unit $(PYTEST_ARGS)

# The fault suite kills brokers and databases: it gets a stack of its own, every port shifted
# by 2000, data in .stack-faults/, so the development stack is never disturbed.
# FAULTS_SCALE sizes the scenarios' runs (1: full size, results in bench/results/faults.json).
# It has three hosts (network namespaces, as root): the host faults and the 3-host e2e run;
# two routers and two aggregators, so that every scenario's runs are shared by both.
FAULTS_SCALE ?= 1
FAULTS_ENV := EVALSTREAM_PORT_OFFSET=2000 EVALSTREAM_STACK=$(CURDIR)/.stack-faults WORKER_MODEL=null,replay:* \
  FAULTS_SCALE=$(FAULTS_SCALE) ROUTERS=2 AGGREGATORS=2
test-faults: venv
	@env $(FAULTS_ENV) $(PY) ops/local/stack.py up --workers 1 --hosts 3
	@env $(FAULTS_ENV) bash -c '$(CLIENT_ENV) && $(PY) -m pytest -m "faults or hosts" $(PYTEST_ARGS)'

down-faults:
	@env $(FAULTS_ENV) python3 ops/local/stack.py down

# Benchmarks get a stack of their own (ports +4000, data in .stack-bench/): the development
# and fault stacks are never touched. Results in bench/results/, the table in README.md.
bench: venv
	@env EVALSTREAM_PORT_OFFSET=4000 EVALSTREAM_STACK=$(CURDIR)/.stack-bench $(PY) ops/local/stack.py up --workers 1
	@env EVALSTREAM_PORT_OFFSET=4000 EVALSTREAM_STACK=$(CURDIR)/.stack-bench $(PY) bench/run_all.py

lint: venv
	@.venv/bin/ruff check . && .venv/bin/ruff format --check . && .venv/bin/mypy

lock:
	@uv pip compile requirements.in -o requirements.lock --python-version 3.11 -q
