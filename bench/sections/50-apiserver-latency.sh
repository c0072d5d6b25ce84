#!/usr/bin/env bash
# Section 5 of `make bench`: label PATCH latency through a real kube-apiserver, interleaved:
# no admission, the webhook (deploy/base), the CEL policy (deploy/cel). The program starts and
# stops its own control plane and webhook; see tests/e2e/cmd/apilatency.
#   bench/sections/50-apiserver-latency.sh OUT_DIR [--smoke]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:?usage: $0 OUT_DIR [--smoke]}"
# Besides none, the shipped webhook (HTTP/2 to a loopback URL) and CEL: the webhook over HTTP/1.1
# to a non-loopback address (what the API server speaks to a Service) and a no-op webhook with the
# same configuration there and on loopback, so that ours − no-op is serve's own cost.
args=(-variants http1,noop+http1,noop)
[[ "${2:-}" == "--smoke" ]] && args=(-smoke -variants http1,noop+http1)
mkdir -p "$out/50-apiserver-latency"
echo "## 5. Through the API server: label PATCH latency"
echo
echo "client-go PATCHes of an allowed deploy-label flip on a Node, interleaved in rounds: no admission, the webhook of deploy/base (on loopback, HTTP/2, and on this machine's address, HTTP/1.1 as to a Service), a no-op webhook with the same configuration, the ValidatingAdmissionPolicy of deploy/cel."
echo
GDG_BIN="$root/target/release/gpu-deploy-guard" bash "$root/tests/e2e/apilatency.sh" "${args[@]}" \
  | tee "$out/50-apiserver-latency/table.md"
