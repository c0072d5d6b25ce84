#!/usr/bin/env bash
# Prints the path of the oha load generator the bench harness drives, installing the pinned
# version from crates.io into ~/.cache/gpu-deploy-guard the first time (about 3.5 minutes of
# compiling on two cores, so `make test` starts it in the background: tests/build/prebuild.sh).
#
#   tests/build/oha.sh          prints the path (installs first if needed)
#
# One installer at a time: a second caller waits for the first, then finds it.
set -euo pipefail

OHA_VERSION=1.16.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-deploy-guard"
tools="$cache/bench-tools-oha-$OHA_VERSION"
mkdir -p "$cache"
exec 9>"$cache/.oha.lock"
flock 9
if [[ ! -x $tools/bin/oha ]]; then
    echo "oha: installing oha $OHA_VERSION into $tools (once; several minutes on 2 cores)" >&2
    started=$SECONDS
    "${CARGO:-cargo}" install --locked --quiet oha --version "$OHA_VERSION" --root "$tools" \
        --no-default-features --features rustls >&2
    echo "oha: installed in $((SECONDS - started))s" >&2
fi
echo "$tools/bin/oha"
