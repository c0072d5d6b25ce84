# gpu-deploy-guard: build, test and try the webhook.
# `make test` is what CI runs (.ci/run); it builds everything it needs itself.

CARGO ?= cargo
BIN := target/release/gpu-deploy-guard

.PHONY: all build test unit lint e2e playground playground-down bench clean

all: build

build:
	$(CARGO) build --release --locked

## test: everything CI runs: formatting, lints, unit/integration tests, end-to-end tests.
test: lint unit e2e

unit:
	$(CARGO) test --locked --all-targets

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings

e2e: build
	@echo "e2e: not wired yet"

clean:
	$(CARGO) clean
