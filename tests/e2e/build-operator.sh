#!/usr/bin/env bash
# Build the real NVIDIA GPU Operator once per version for the oracle tests
# (tests/e2e/oracle_test.go), into the same cache as the control plane:
#   ${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}/gpu-operator-<tag>/
#     bin/gpu-operator          static binary (go install, CGO off)
#     root/                     the small root it runs chrooted in:
#       opt/gpu-operator/<state>/, opt/gpu-operator/manifests/  (its assets,
#           the layout of the operator image; the paths are hard-coded)
#       host-etc/os-release     (read by v25.x before the dcgm-exporter state)
#       bin/gpu-operator        (the binary again, so it can be exec'd there)
#     crds/                     deployments/gpu-operator/crds/ of the module
#     clusterpolicy.yaml        config/samples/v1_clusterpolicy.yaml
#
# The module's v22+ tags are not valid Go module versions (no /vN in the
# module path), so each version is fetched by its pseudo-version. Only the
# versions listed below are served by the Go module proxy (the others answer
# 403); GDG_OPERATOR_VERSION picks one by tag (default: the newest served).
#
# stdout: GDG_OPERATOR_DIR=<dir> and GDG_OPERATOR_VERSION=<tag>, nothing else.
# A cold build takes about 3 minutes on 2 cores; afterwards it is instant.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start=$SECONDS
log() { echo "build-operator: $*" >&2; }

# tag -> pseudo-version (commit time in UTC + 12 hex digits of the tag's commit)
declare -A pseudo=(
  [v25.3.4]=v0.0.0-20250917190837-d73a0086a6ba
)
tag="${GDG_OPERATOR_VERSION:-v25.3.4}"
ver="${pseudo[$tag]:-}"
[[ -n "$ver" ]] || { log "no module version known for GPU Operator $tag (known: ${!pseudo[*]})"; exit 1; }
mod=github.com/NVIDIA/gpu-operator

export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
cache_root="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
dir="$cache_root/gpu-operator-$tag"
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9

if [[ -x "$dir/root/bin/gpu-operator" && -f "$dir/clusterpolicy.yaml" && -d "$dir/crds" ]]; then
  log "using cached GPU Operator $tag in $dir ($((SECONDS - start))s)"
else
  log "building GPU Operator $tag ($mod@$ver, go $(go env GOVERSION), $(nproc) cores)"
  tmp="$(mktemp -d "$dir/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  # Run outside any module so go.mod files of this repository play no part.
  src="$(cd "$tmp" && GO111MODULE=on go mod download -json "$mod@$ver" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$src/assets" ]] || { log "module $mod@$ver has no assets/ (got dir '$src')"; exit 1; }
  t=$SECONDS
  (cd "$tmp" && GOBIN="$tmp/gobin" go install -trimpath -ldflags="-s -w" "$mod/cmd/gpu-operator@$ver")
  log "go install: $((SECONDS - t))s"
  mkdir -p "$tmp/root/bin" "$tmp/root/opt/gpu-operator" "$tmp/root/host-etc" "$tmp/root/tmp" "$tmp/root/etc"
  cp "$tmp/gobin/gpu-operator" "$tmp/root/bin/gpu-operator"
  cp -r "$src"/assets/. "$tmp/root/opt/gpu-operator/"
  cp -r "$src/manifests" "$tmp/root/opt/gpu-operator/manifests"
  printf 'ID=ubuntu\nVERSION_ID="22.04"\nNAME="Ubuntu"\n' >"$tmp/root/host-etc/os-release"
  cp -r "$src/deployments/gpu-operator/crds" "$tmp/crds"
  cp "$src/config/samples/v1_clusterpolicy.yaml" "$tmp/clusterpolicy.yaml"
  chmod -R u+w "$tmp"
  rm -rf "$dir/root" "$dir/crds"
  mv "$tmp/root" "$tmp/crds" "$tmp/clusterpolicy.yaml" "$dir/"
  log "built in $((SECONDS - start))s"
fi

echo "GDG_OPERATOR_DIR=$dir"
echo "GDG_OPERATOR_VERSION=$tag"
