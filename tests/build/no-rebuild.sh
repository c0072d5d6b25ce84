#!/usr/bin/env bash
# A second release build (make build's: tests/build/release.sh, `cargo auditable build --release
# --locked`) with nothing changed compiles nothing: the build script names only paths that exist
# (a missing one reads as changed on every call), and cargo-auditable's wrapper, part of the
# crate's fingerprint, is the same each time. Run after a release build; prints the second
# build's time.
set -euo pipefail
cd "$(dirname "$0")/../.."
bash tests/build/release.sh >/dev/null 2>&1
start=$(date +%s%N)
out=$(bash tests/build/release.sh -v 2>&1)
took_ms=$(( ($(date +%s%N) - start) / 1000000 ))
if grep -E '^\s*(Compiling|Dirty|Running) ' <<<"$out" | grep -q .; then
  echo "no-rebuild: the second cargo auditable build did work:" >&2
  grep -E '^\s*(Compiling|Dirty|Running) ' <<<"$out" >&2
  exit 1
fi
grep -q 'Fresh gpu-deploy-guard' <<<"$out" || { echo "no-rebuild: cargo did not report the crate fresh:" >&2; echo "$out" >&2; exit 1; }
echo "no-rebuild: second cargo auditable build --release with nothing changed: ${took_ms} ms, nothing compiled"
