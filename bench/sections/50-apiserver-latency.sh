#!/usr/bin/env bash
# Section 5 of `make bench`: label PATCH latency through a real kube-apiserver, interleaved:
# no admission, the webhook (deploy/base), the CEL policy (deploy/cel). The program starts and
# stops its own control plane and webhook; see tests/e2e/cmd/apilatency.
#   bench/sections/50-apiserver-latency.sh OUT_DIR [--smoke]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="${1:?usage: $0 OUT_DIR [--smoke]}"
args=()
# The smoke run also takes one -variants mode through its path (extra serve, metrics, the
# paired table), so the tool behind BENCHMARKS.md's variant tables cannot rot unseen.
[[ "${2:-}" == "--smoke" ]] && args+=(-smoke -variants enforce+nomc+idle=150s)
mkdir -p "$out/50-apiserver-latency"
echo "## 5. Through the API server: label PATCH latency"
echo
echo "client-go PATCHes of an allowed deploy-label flip on a Node, interleaved in rounds: no admission, the webhook of deploy/base on loopback, the ValidatingAdmissionPolicy of deploy/cel."
echo
GDG_BIN="$root/target/release/gpu-deploy-guard" bash "$root/tests/e2e/apilatency.sh" "${args[@]}" \
  | tee "$out/50-apiserver-latency/table.md"
