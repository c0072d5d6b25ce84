# gpu-deploy-guard: build, test and try the webhook.
# `make test` is what CI runs (.ci/run); it builds everything it needs itself.

CARGO ?= cargo
BIN := target/release/gpu-deploy-guard

.PHONY: all build prebuild no-rebuild test unit lint e2e monitoring-test helm-test image-test render-manifests cel-test playground playground-down bench bench-smoke bench-scale bench-connections fuzz fuzz-smoke soak clean

all: build

## build: the release binary, built as the image's is: `cargo auditable build --release --locked`
## (tests/build/release.sh says why every user of the binary shares this one build).
build:
	CARGO=$(CARGO) bash tests/build/release.sh

## test: everything CI runs: formatting, lints, unit/integration tests, end-to-end tests.
## The fuzz smoke run comes after e2e: its targets build in the background meanwhile (prebuild).
test: prebuild lint unit monitoring-test helm-test e2e fuzz-smoke no-rebuild image-test cel-test bench-smoke

## prebuild: the e2e step's Go builds (control plane, GPU Operator, test binaries), started in the
## background at low priority while the steps before it run; they stop if this make ends first.
prebuild:
	bash tests/build/prebuild.sh $$PPID

unit:
	$(CARGO) test --locked

## no-rebuild: a second release build (make build's) with nothing changed compiles nothing.
no-rebuild: build
	bash tests/build/no-rebuild.sh

## lint: formatting, clippy, and cargo deny over Cargo.lock (licences, banned crates, sources:
## deny.toml).
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --locked --all-targets -- -D warnings
	PATH="$$(bash tests/build/cargo-tool.sh deny):$$PATH" $(CARGO) deny --locked check licenses bans sources

## e2e: the end-to-end suite (tests/e2e) against the release binary; the
## control plane is built once into ~/.cache/gpu-deploy-guard.
e2e: build
	GDG_BIN=$(CURDIR)/$(BIN) tests/e2e/run.sh

## monitoring-test: promtool checks and unit tests of every alert, amtool checks of the Alertmanager example, dashboard and CRD sync checks.
monitoring-test:
	bash tests/monitoring/run.sh

## helm-test: helm lint, values schema, stale-manifest check and offline validation of every rendered object
## (builds helm from the Go module proxy once; installs kubernetes-validate into a venv in the cache).
helm-test:
	bash tests/helm/run.sh

## render-manifests: re-render deploy/release, deploy/base, the cert-manager overlay, deploy/cel and the ServiceMonitor from the chart.
render-manifests:
	bash deploy/render-manifests.sh

## image-test: what can be tested of the container image without a Docker engine: the binary the
## Dockerfile's cargo command builds links only against distroless/cc's libraries, serves as uid 65532,
## and carries the dependency list cargo auditable embeds (.dep-v0), the crates of Cargo.lock it is built from.
image-test: build
	GDG_BIN=$(CURDIR)/$(BIN) bash tests/image/run.sh

## cel-test: the ValidatingAdmissionPolicy fallback against a real kube-apiserver (after e2e: reuses its build cache).
cel-test:
	bash tests/cel/run.sh


# The playground runs detached (its own session, so Ctrl-C in this shell or
# the end of `make` does not stop it) until `make playground-down`.
PLAYGROUND_DIR := .playground
PLAYGROUND_PID := $(PLAYGROUND_DIR)/playground.pid
PLAYGROUND_LOG := $(PLAYGROUND_DIR)/playground.log
PLAYGROUND_START_TIMEOUT ?= 180

## playground: control plane + webhook + lab in the background; prints how to use it.
playground: build
	@mkdir -p $(PLAYGROUND_DIR)
	@if [ -f $(PLAYGROUND_PID) ] && kill -0 "$$(cat $(PLAYGROUND_PID))" 2>/dev/null; then \
	  echo "playground already running (pid $$(cat $(PLAYGROUND_PID))); make playground-down first" >&2; exit 1; fi
	@echo "playground: building the control plane (kube-apiserver, kube-controller-manager, etcd) from the Go module proxy;"
	@echo "playground: the first time this takes about 6 minutes on 2 cores (10 when other builds share them), then it is cached in ~/.cache/gpu-deploy-guard."
	bash tests/e2e/build-control-plane.sh >/dev/null
	cd tests/e2e && GOFLAGS="-mod=readonly -buildvcs=false" go build -o $(CURDIR)/$(PLAYGROUND_DIR)/playground ./cmd/playground
	@GDG_BIN=$(CURDIR)/$(BIN) setsid $(PLAYGROUND_DIR)/playground -dir $(CURDIR)/$(PLAYGROUND_DIR) \
	  >$(PLAYGROUND_LOG) 2>&1 </dev/null & pid=$$!; \
	deadline=$$(( $$(date +%s) + $(PLAYGROUND_START_TIMEOUT) )); \
	until grep -q '^ready' $(PLAYGROUND_LOG); do \
	  if ! kill -0 $$pid 2>/dev/null; then echo "playground exited during start-up:" >&2; cat $(PLAYGROUND_LOG) >&2; exit 1; fi; \
	  if [ $$(date +%s) -ge $$deadline ]; then echo "playground not ready after $(PLAYGROUND_START_TIMEOUT)s; stopping it:" >&2; \
	    kill $$pid; tail -n 40 $(PLAYGROUND_LOG) >&2; exit 1; fi; \
	  sleep 0.5; \
	done; \
	sed -n '/^ready/,$$p' $(PLAYGROUND_LOG)

## playground-down: stop the playground and wait until it is gone.
# A process that has exited but not been reaped yet (a zombie: the shell that
# started it is gone) counts as stopped.
playground-down:
	@if [ ! -f $(PLAYGROUND_PID) ]; then echo "playground not running (no $(PLAYGROUND_PID))"; exit 0; fi; \
	pid=$$(cat $(PLAYGROUND_PID)); \
	alive() { [ -d /proc/$$pid ] && ! grep -q '^State:[[:space:]]*Z' /proc/$$pid/status 2>/dev/null; }; \
	if ! alive; then echo "playground pid $$pid is gone; removing stale $(PLAYGROUND_PID)"; rm -f $(PLAYGROUND_PID); exit 0; fi; \
	kill $$pid; \
	for i in $$(seq 1 120); do alive || { echo "playground (pid $$pid) stopped"; exit 0; }; sleep 0.5; done; \
	echo "playground (pid $$pid) still running after 60s; its log: $(PLAYGROUND_LOG)" >&2; exit 1

## bench: every benchmark in one go (about 10 minutes once built): prints the table, writes target/bench/summary.md.
bench:
	bash bench/run.sh

## bench-smoke: the bench harness at tiny sizes (under a minute once built), so it cannot rot.
bench-smoke:
	bash bench/run.sh --smoke

## fuzz: coverage-guided fuzzing for FUZZ_SECONDS (default 10 minutes) per target, seeded with the
## fixtures: review parsing and the decision, and the body scanner against serde. Installs
## cargo-fuzz if missing. See fuzz/run.sh.
FUZZ_SECONDS ?= 600
fuzz:
	bash fuzz/run.sh $(FUZZ_SECONDS)

## fuzz-smoke: the same targets for 40 s each, built without optimisation, so they cannot rot
## (part of `make test`).
fuzz-smoke:
	FUZZ_DEV=1 bash fuzz/run.sh 40

## soak: `serve` for SOAK_DURATION (default 10 minutes) under mixed good, bad and hostile reviews
## with a certificate rotation every minute; checks answers, flat memory and metrics totals.
## SOAK_ARGS go to the command (e.g. -share-attacks; tests/e2e/cmd/soak, -help). Not part of `make test`.
SOAK_DURATION ?= 10m
SOAK_RATE ?= 200
SOAK_ARGS ?=
soak: build
	cd tests/e2e && GOFLAGS="-mod=readonly -buildvcs=false" go build -o $(CURDIR)/target/soak ./cmd/soak
	target/soak -bin $(BIN) -fixtures tests/fixtures/reviews -duration $(SOAK_DURATION) -rate $(SOAK_RATE) -attack -rss-limit-mib 48 $(SOAK_ARGS)

## bench-connections: what each kind of webhook connection (silent TCP, idle TLS HTTP/1.1 and HTTP/2,
## HTTP/2 with a request held open) costs `serve` in RSS, at CONN_COUNTS connections (default 64,256),
## with the chart's GLIBC_TUNABLES: the figure --max-connections is sized by. About a minute.
CONN_COUNTS ?= 64,256
bench-connections: build
	cd tests/e2e && GOFLAGS="-mod=readonly -buildvcs=false" go build -o $(CURDIR)/target/benchconns ./cmd/benchconns
	target/benchconns -bin $(BIN) -counts $(CONN_COUNTS)

## bench-scale: `serve` (SCALE_REPLICAS, default 2, with the chart's args and RBAC) and `audit` against the
## e2e control plane filled with SCALE_NODES large nodes (default 1000,5000,10000), each with 5 Running
## operand pods: peak and settled RSS, time to ready, CPU at rest and under N/300 status heartbeats/s,
## /metrics size, audit wall time and peak RSS. One table per N; target/bench-scale/results.{json,tsv}.
## Each size ends with a custom-resource flood (40 NVIDIADrivers and 6 ClusterPolicies of 1 MB, then
## deleted: the replicas' RSS with them and after). SCALE_ARGS=-broken leaves every toolkit pod Pending,
## so every node fails (an operator upgrade gone wrong).
## SCALE_BIN measures another build (then nothing is built); SCALE_ARGS go to the command
## (tests/e2e/cmd/benchscale, -help). About 12 minutes for the three sizes. Not part of `make test`.
SCALE_NODES ?= 1000,5000,10000
SCALE_REPLICAS ?= 2
SCALE_BIN ?= $(BIN)
SCALE_ARGS ?=
bench-scale: $(if $(filter $(BIN),$(SCALE_BIN)),build)
	cd tests/e2e && GOFLAGS="-mod=readonly -buildvcs=false" go build -o $(CURDIR)/target/benchscale ./cmd/benchscale
	target/benchscale -bin $(SCALE_BIN) -nodes $(SCALE_NODES) -replicas $(SCALE_REPLICAS) $(SCALE_ARGS)

clean:
	$(CARGO) clean
