#!/usr/bin/env bash
# Run the gpu-deploy-guard end-to-end suite against a real local control plane.
#
#   tests/e2e/run.sh [go test args...]      e.g. -run TestControlPlane
#
# Env:
#   GDG_BIN        gpu-deploy-guard binary under test (passed through; tests
#                  that need it fail when it is unset)
#   GDG_CACHE      control-plane binary cache (default ~/.cache/gpu-deploy-guard)
#   KUBECTL        kubectl to use (default: gcloud SDK kubectl.1.33, else built)
#   GDG_E2E_TIMEOUT  go test -timeout (default 30m)
#   GDG_E2E_KEEP=1 keep the work dir (certs, kubeconfig, logs) after the run
#
# Exits non-zero when the build or any test fails.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start=$SECONDS

# Build (or reuse) the control plane; the script prints KEY=VALUE lines.
build_out="$(bash "$here/build-control-plane.sh")"
while IFS='=' read -r key value; do
  case "$key" in
    GDG_K8S_BIN_DIR|KUBECTL) export "$key=$value" ;;
  esac
done <<<"$build_out"
: "${GDG_K8S_BIN_DIR:?build-control-plane.sh did not report GDG_K8S_BIN_DIR}"

if [[ -n "${GDG_BIN:-}" ]]; then
  [[ -x "$GDG_BIN" ]] || { echo "run.sh: GDG_BIN=$GDG_BIN is not executable" >&2; exit 1; }
  GDG_BIN="$(cd "$(dirname "$GDG_BIN")" && pwd)/$(basename "$GDG_BIN")" # tests run in another cwd
  export GDG_BIN
fi

# All control-plane state of this run lives here. The framework removes its
# part itself; this catches what a crashed test binary (panic, timeout)
# leaves behind, and prints its component logs if nobody did yet.
GDG_E2E_WORKDIR="$(mktemp -d "${TMPDIR:-/tmp}/gdg-e2e.XXXXXX")"
export GDG_E2E_WORKDIR
cleanup() {
  local rc=$?
  if [[ $rc -ne 0 && ! -e "$GDG_E2E_WORKDIR/.logs-dumped" ]]; then
    for f in "$GDG_E2E_WORKDIR"/*/logs/*.log; do
      [[ -e "$f" ]] || continue
      echo "==> $f (last 200 lines) <=="
      tail -n 200 "$f"
    done
  fi
  if [[ "${GDG_E2E_KEEP:-}" == 1 ]]; then
    echo "run.sh: kept $GDG_E2E_WORKDIR" >&2
  else
    rm -rf "$GDG_E2E_WORKDIR"
  fi
  echo "run.sh: finished in $((SECONDS - start))s, exit $rc" >&2
  exit $rc
}
trap cleanup EXIT

cd "$here"
# -p 1: one test package at a time. Each package (., oracle/) starts a
# control plane of its own; two at once on a small CI machine would slow
# both and make their timing-sensitive tests flaky.
GOFLAGS=-mod=readonly go test -p 1 -count=1 -v -timeout="${GDG_E2E_TIMEOUT:-30m}" ./... "$@"
