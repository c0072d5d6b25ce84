#!/usr/bin/env bash
# Fuzzes, for SECONDS each (default 60), seeded with the fixtures:
#   review  review parsing, the decision and the answer (fuzz_targets/review.rs)
#   scan    the body scanner against serde: the same answer either way (fuzz_targets/scan.rs)
# `run.sh SECONDS TARGET` runs one of them. Without cargo-fuzz on PATH, takes the pinned prebuilt
# one (tests/build/cargo-tool.sh). Uses the nightly toolchain with AddressSanitizer when there is
# one; otherwise the stable compiler with
# RUSTC_BOOTSTRAP=1 and no sanitizer (coverage guidance works the same; FUZZ_STABLE=1 forces it).
# FUZZ_DEV=1 builds the targets without optimisation (cargo fuzz --dev): a build of minutes
# instead of a quarter of an hour on two cores, for the short run in `make test`.
# FUZZ_BUILD_ONLY=1 builds them and runs nothing.
# A crash leaves its input in fuzz/artifacts/<target>/ and fails the run; reproduce it with
#   cargo fuzz run <target> fuzz/artifacts/<target>/<file>
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

if ! cargo fuzz --version >/dev/null 2>&1; then
  PATH="$(bash tests/build/cargo-tool.sh fuzz):$PATH"
fi

toolchain=()
options=()
if [ -z "${FUZZ_STABLE:-}" ] && rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=(+nightly)
else
  echo "fuzz: no nightly toolchain; stable rustc with RUSTC_BOOTSTRAP=1, no sanitizer" >&2
  export RUSTC_BOOTSTRAP=1
  options=(-s none)
fi

[ -z "${FUZZ_DEV:-}" ] || options+=(--dev)

targets=("${@:2}")
[ ${#targets[@]} -gt 0 ] || targets=(review scan)
# FUZZ_BUILD_ONLY=1: build the targets as the run would, and run nothing (make test builds them
# in the background while other steps run: tests/build/prebuild.sh).
if [ -n "${FUZZ_BUILD_ONLY:-}" ]; then
  for target in "${targets[@]}"; do
    cargo "${toolchain[@]}" fuzz build "${options[@]}" "$target"
  done
  exit 0
fi
for target in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$target"
  echo "fuzz: $target for ${seconds}s" >&2
  # The first directory collects what the fuzzer finds; the fixtures only seed it.
  cargo "${toolchain[@]}" fuzz run "${options[@]}" "$target" \
    "fuzz/corpus/$target" tests/fixtures/reviews tests/fixtures/nodes tests/fixtures/real-nodes \
    -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
done
