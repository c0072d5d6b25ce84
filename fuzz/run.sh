#!/usr/bin/env bash
# Fuzzes review parsing and the decision (fuzz_targets/review.rs) for SECONDS (default 60),
# seeded with the fixtures. Installs cargo-fuzz if missing. Uses the nightly toolchain with
# AddressSanitizer when there is one; otherwise the stable compiler with RUSTC_BOOTSTRAP=1 and
# no sanitizer (coverage guidance works the same). A crash leaves its input in
# fuzz/artifacts/review/ and fails the run; reproduce it with
#   cargo fuzz run review fuzz/artifacts/review/<file>
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}

if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked
fi

toolchain=()
sanitizer=()
if [ -z "${FUZZ_STABLE:-}" ] && rustup run nightly rustc --version >/dev/null 2>&1; then
  toolchain=(+nightly)
else
  echo "fuzz: no nightly toolchain; stable rustc with RUSTC_BOOTSTRAP=1, no sanitizer" >&2
  export RUSTC_BOOTSTRAP=1
  sanitizer=(-s none)
fi

mkdir -p fuzz/corpus/review
# The first directory collects what the fuzzer finds; the fixtures only seed it.
cargo "${toolchain[@]}" fuzz run "${sanitizer[@]}" review \
  fuzz/corpus/review tests/fixtures/reviews tests/fixtures/nodes tests/fixtures/real-nodes \
  -- -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
