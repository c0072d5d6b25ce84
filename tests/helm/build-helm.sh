#!/usr/bin/env bash
# Build helm once from the Go module proxy into the e2e binary cache, like
# tests/e2e/build-control-plane.sh does for the control plane.
#
#   ${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}/helm-<version>/bin/helm
#
# stdout: one line `HELM=<path>`; progress goes to stderr.
set -euo pipefail

version="${GDG_HELM_VERSION:-v3.19.5}"
cache_root="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
dir="$cache_root/helm-$version"
bin="$dir/bin"
mkdir -p "$bin"
log() { echo "build-helm: $*" >&2; }

exec 9>"$dir/.lock"
flock 9
if [[ -x "$bin/helm" ]]; then
  log "using cached $bin/helm"
else
  start=$SECONDS
  log "building helm.sh/helm/v3/cmd/helm@$version into $bin (go $(go env GOVERSION))"
  tmp="$(mktemp -d "$dir/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # Static, no VCS stamping; the version is stamped the way helm's Makefile does.
  CGO_ENABLED=0 GOFLAGS="-mod=mod -buildvcs=false" GOBIN="$tmp" \
    go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$version -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
    "helm.sh/helm/v3/cmd/helm@$version"
  mv -f "$tmp/helm" "$bin/helm"
  log "built in $((SECONDS - start))s"
fi
echo "HELM=$bin/helm"
