#!/usr/bin/env bash
# Prints the path of the oha load generator the bench harness drives, installing the pinned
# version from crates.io into ~/.cache/gpu-deploy-guard the first time (about 3.5 minutes of
# compiling on two cores, so `make test` starts it in the background: tests/build/prebuild.sh).
#
#   tests/build/oha.sh          prints the path (installs first if needed)
#   tests/build/oha.sh --debug  the same oha built without optimisation, for bench-smoke: its
#                               1-second load runs at a few hundred requests a second need no
#                               fast client, and the build takes about half as long
#
# One installer at a time: a second caller waits for the first, then finds it.
set -euo pipefail

OHA_VERSION=1.16.0
cache="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-deploy-guard"
profile=()
tools="$cache/bench-tools-oha-$OHA_VERSION"
if [[ ${1:-} == --debug ]]; then
    profile=(--debug)
    tools="$tools-debug"
fi
mkdir -p "$cache"
exec 9>"$cache/.oha.lock"
flock 9
if [[ ! -x $tools/bin/oha ]]; then
    echo "oha: installing oha $OHA_VERSION ${profile[*]:-} into $tools (once; minutes on 2 cores)" >&2
    started=$SECONDS
    "${CARGO:-cargo}" install --locked --quiet oha --version "$OHA_VERSION" --root "$tools" \
        "${profile[@]}" --no-default-features --features rustls >&2
    echo "oha: installed in $((SECONDS - started))s" >&2
fi
echo "$tools/bin/oha"
