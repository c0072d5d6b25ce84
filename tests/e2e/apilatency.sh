#!/usr/bin/env bash
# API-server latency of Node label PATCHes, interleaved: no admission, the
# gpu-deploy-guard webhook (deploy/base), the CEL policy (deploy/cel). Starts
# its own control plane (built once and cached by build-control-plane.sh) and
# prints a markdown table. See cmd/apilatency/main.go.
#
#   GDG_BIN=target/release/gpu-deploy-guard tests/e2e/apilatency.sh          # full run, ~4 min
#   GDG_BIN=target/release/gpu-deploy-guard tests/e2e/apilatency.sh -smoke   # CI: seconds
#
# Extra arguments go to the program (-rounds, -n, -warmup, -smoke). Exits
# non-zero when the control plane or the webhook cannot start, a PATCH fails,
# or the webhook and the CEL policy decide a lab change differently; missing
# the latency targets is reported in the output, not in the exit status.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
: "${GDG_BIN:?set GDG_BIN to the gpu-deploy-guard release binary (make build)}"
[[ -x "$GDG_BIN" ]] || { echo "apilatency.sh: GDG_BIN=$GDG_BIN is not executable" >&2; exit 1; }
GDG_BIN="$(cd "$(dirname "$GDG_BIN")" && pwd)/$(basename "$GDG_BIN")"
export GDG_BIN

build_out="$(bash "$here/build-control-plane.sh")"
while IFS='=' read -r key value; do
  case "$key" in
    GDG_K8S_BIN_DIR|KUBECTL) export "$key=$value" ;;
  esac
done <<<"$build_out"
: "${GDG_K8S_BIN_DIR:?build-control-plane.sh did not report GDG_K8S_BIN_DIR}"

work="$(mktemp -d "${TMPDIR:-/tmp}/gdg-apilatency.XXXXXX")"
trap 'rm -rf "$work"' EXIT
(cd "$here" && GOFLAGS="-mod=readonly -buildvcs=false" go build -o "$work/apilatency" ./cmd/apilatency)
# Not exec: the trap removes the binary afterwards. The control plane the
# program starts dies with it (Pdeathsig) even if it is killed.
"$work/apilatency" "$@"
