#!/usr/bin/env bash
# The release build of target/release/gpu-deploy-guard, for everything that runs it: `make build`
# (so e2e, image-test, playground, soak, bench-scale), tests/build/no-rebuild.sh and bench/run.sh.
# Extra arguments go to cargo (--quiet, --bin gpu-deploy-guard, -v).
#
#   cargo auditable build --release --locked
#
# is deploy/Dockerfile's command for the host (its --bin and --target only change the output
# directory), so the binary the tests run is the image's, dependency list (.dep-v0) included,
# which tests/image/run.sh checks against Cargo.lock. Why here and not a second build for the
# image test alone: cargo-auditable sets RUSTC_WORKSPACE_WRAPPER, which is part of the hash of
# this crate's artifacts (not of its dependencies'), so a plain `cargo build --release` and this
# one each compile the crate (about 80 s wall, 115 s of CPU on two cores) and then keep both
# variants, copying whichever ran last to target/release/gpu-deploy-guard. One build for all of
# them costs CI only cargo-auditable's own install (once per machine, about 25 s), where a
# separate image-test build would add a release build of the crate to every run. Anything that
# runs target/release/gpu-deploy-guard must build it here, not with a plain `cargo build
# --release`: that would compile the crate again and leave a binary without the list.
set -euo pipefail
cd "$(dirname "$0")/../.."
PATH="$(bash tests/build/cargo-tool.sh auditable):$PATH"
exec "${CARGO:-cargo}" auditable build --release --locked "$@"
