#!/usr/bin/env bash
# Starts, in the background and at low priority, the builds that `make test` needs only from
# its end-to-end step on: the control plane (kube-apiserver, kube-controller-manager, etcd:
# 10-12 minutes cold on two cores), the GPU Operator of the oracle tests (2-3 minutes), the e2e
# suite's test binaries, the release binary, the fuzz smoke run's targets, the benches and oha
# (the bench smoke run's load generator).
# Until that step the machine has idle time (fuzz runs, tests, the monitoring and helm checks
# use one core or none); the builds take it, and the steps that need them find them done or
# wait for them (each build script holds a lock per cache entry, go's build cache is shared,
# cargo locks target/, oha.sh holds a lock while it installs).
#
#   tests/build/prebuild.sh <pid>   builds while process <pid> (make) lives; stops with it
#
# Returns at once. The log is target/prebuild.log; a build that fails here is simply run
# again, in the foreground, by the step that needs it, which reports its error.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

builds() {
    echo "prebuild: started $(date -u +%FT%TZ)"
    local start=$SECONDS
    nice -n 10 bash "$root/tests/e2e/build-control-plane.sh" >/dev/null &&
        echo "prebuild: control plane ready after $((SECONDS - start))s"
    nice -n 10 bash "$root/tests/e2e/build-operator.sh" >/dev/null &&
        echo "prebuild: GPU Operator ready after $((SECONDS - start))s"
    # Compiled only (-c), never run: a test package's TestMain starts a control plane.
    local out
    out=$(mktemp -d)
    (cd "$root/tests/e2e" && GOFLAGS="-mod=readonly -buildvcs=false" nice -n 10 go test -c -o "$out/" ./... >/dev/null) &&
        echo "prebuild: e2e test binaries built after $((SECONDS - start))s"
    rm -rf "$out"
    # Then what the steps after the unit tests need: the release binary (e2e, image-test,
    # bench-smoke; cargo's lock on target/ makes a foreground build wait for it, never build
    # it twice) and bench-smoke's load generator, built while the fuzz run, the monitoring and
    # helm checks and the e2e suite leave a core idle.
    nice -n 10 bash "$root/tests/build/release.sh" --quiet &&
        echo "prebuild: release binary built after $((SECONDS - start))s"
    # The fuzz smoke run's targets (fuzz/target, no lock shared with target/) and the benches
    # the bench smoke run compiles (the bench profile), then its load generator.
    (cd "$root" && FUZZ_DEV=1 FUZZ_BUILD_ONLY=1 nice -n 10 bash fuzz/run.sh 0 >/dev/null 2>&1) &&
        echo "prebuild: fuzz targets built after $((SECONDS - start))s"
    (cd "$root" && nice -n 10 cargo bench --locked --quiet --no-run >/dev/null 2>&1) &&
        echo "prebuild: benches built after $((SECONDS - start))s"
    nice -n 10 bash "$root/tests/build/oha.sh" --debug >/dev/null &&
        echo "prebuild: oha ready after $((SECONDS - start))s"
    echo "prebuild: done after $((SECONDS - start))s"
}

# The builds themselves, as the background session below runs them.
if [[ "${1:-}" == --builds ]]; then
    builds
    exit 0
fi

owner=${1:?usage: prebuild.sh <pid of the make that runs the tests>}
mkdir -p "$root/target"
log="$root/target/prebuild.log"

# Its own session, so that it can be stopped as a group when the make that started it ends
# first (Ctrl-C, a failing step): no build is left running on its own.
setsid bash -c '
    owner=$1 log=$2
    shift 2
    "$@" >>"$log" 2>&1 &
    work=$!
    while kill -0 "$work" 2>/dev/null; do
        if ! kill -0 "$owner" 2>/dev/null; then
            echo "prebuild: stopped: the make that started it has ended" >>"$log"
            kill -- -$$ 2>/dev/null
            exit 0
        fi
        sleep 2
    done
' prebuild "$owner" "$log" bash "${BASH_SOURCE[0]}" --builds </dev/null >/dev/null 2>&1 &
echo "prebuild: Go builds of the e2e step started in the background (log: target/prebuild.log)"
