#!/usr/bin/env bash
# Build the local control plane used by the e2e suite, once per version.
#
# Binaries go to a cache outside the source tree, keyed by the versions in
# tests/e2e/go.mod and tests/e2e/etcd/go.mod:
#   ${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}/k8s-<k8sver>-etcd-<etcdver>/bin/
# A cold build of kube-apiserver + kube-controller-manager + kube-scheduler +
# etcd + kwok takes many minutes on two cores, so an existing cache entry is
# reused as is; a binary missing from it (an entry made before kube-scheduler
# and kwok were added) is built alone.
#
# kwok (sigs.k8s.io/kwok, its version in tests/e2e/kwok/go.mod) is built in
# its own module, as etcd is, and stamped with its version: a cached binary
# whose `kwok --version` names another version is rebuilt.
#
# kubectl: $KUBECTL if set, else the gcloud SDK's kubectl.1.33 when present,
# else kubectl is built from the same k8s.io/kubernetes module into the cache.
# GDG_BUILD_KUBECTL=1 forces the built one (to exercise that path).
#
# stdout: shell-style assignments the suite reads, nothing else:
#   GDG_K8S_BIN_DIR=<dir with kube-apiserver, kube-controller-manager,
#                    kube-scheduler, etcd, kwok>
#   KUBECTL=<kubectl binary>
# Progress and timings go to stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
start=$SECONDS
log() { echo "build-control-plane: $*" >&2; }

export CGO_ENABLED=0           # static binaries, no C toolchain needed
# Never rewrite go.mod/go.sum while building; no VCS stamping (binaries come
# from the module cache, and git may be absent or the checkout unusual).
export GOFLAGS="-mod=readonly -buildvcs=false"

k8s_ver="$(cd "$here" && go list -m -f '{{.Version}}' k8s.io/kubernetes)"
etcd_ver="$(cd "$here/etcd" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)"
kwok_ver="$(cd "$here/kwok" && go list -m -f '{{.Version}}' sigs.k8s.io/kwok)"
cache_root="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
dir="$cache_root/k8s-$k8s_ver-etcd-$etcd_ver"
bin="$dir/bin"
mkdir -p "$bin"

gcloud_kubectl=/usr/lib/google-cloud-sdk/bin/kubectl.1.33
if [[ -n "${KUBECTL:-}" ]]; then
  kubectl="$KUBECTL"
  [[ -x "$kubectl" ]] || { log "KUBECTL=$kubectl is not an executable file"; exit 1; }
elif [[ "${GDG_BUILD_KUBECTL:-}" != 1 && -x "$gcloud_kubectl" ]]; then
  kubectl="$gcloud_kubectl"
else
  kubectl="$bin/kubectl"
fi

# One builder at a time per cache entry; a second caller waits, then finds
# the binaries present.
exec 9>"$dir/.lock"
flock 9

# Same version stamping as the kubernetes release build (hack/lib/version.sh),
# so `kubectl version` and /version report the real release, not v0.0.0-master.
minor="${k8s_ver#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ldflags+=" -X $pkg.gitVersion=$k8s_ver -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
done

k8s_pkgs=()
[[ -x "$bin/kube-apiserver" ]] || k8s_pkgs+=(k8s.io/kubernetes/cmd/kube-apiserver)
[[ -x "$bin/kube-controller-manager" ]] || k8s_pkgs+=(k8s.io/kubernetes/cmd/kube-controller-manager)
[[ -x "$bin/kube-scheduler" ]] || k8s_pkgs+=(k8s.io/kubernetes/cmd/kube-scheduler)
[[ "$kubectl" != "$bin/kubectl" || -x "$bin/kubectl" ]] || k8s_pkgs+=(k8s.io/kubernetes/cmd/kubectl)
need_etcd=0
[[ -x "$bin/etcd" ]] || need_etcd=1
need_kwok=0
[[ -x "$bin/kwok" && "$("$bin/kwok" --version 2>/dev/null)" == "kwok version $kwok_ver "* ]] || need_kwok=1

if [[ ${#k8s_pkgs[@]} -eq 0 && $need_etcd -eq 0 && $need_kwok -eq 0 ]]; then
  log "using cached binaries in $bin ($((SECONDS - start))s)"
else
  what=("${k8s_pkgs[@]}")
  [[ $need_etcd -eq 0 ]] || what+=("etcd $etcd_ver")
  [[ $need_kwok -eq 0 ]] || what+=("kwok $kwok_ver")
  log "building into $bin (go $(go env GOVERSION), $(nproc) cores): ${what[*]}"
  # Build into a scratch dir and move each finished binary in: a binary in
  # bin/ is always complete, even if this build is interrupted.
  tmp="$(mktemp -d "$dir/build.XXXXXX")"
  trap 'rm -rf "$tmp"' EXIT
  if [[ ${#k8s_pkgs[@]} -gt 0 ]]; then
    t=$SECONDS
    # One invocation for all k8s binaries: they share most packages.
    (cd "$here" && go build -trimpath -ldflags="$k8s_ldflags" -o "$tmp/" "${k8s_pkgs[@]}")
    log "k8s.io/kubernetes $k8s_ver: $((SECONDS - t))s"
  fi
  if [[ $need_etcd -eq 1 ]]; then
    t=$SECONDS
    (cd "$here/etcd" && go build -trimpath -ldflags="-s -w" -o "$tmp/etcd" go.etcd.io/etcd/server/v3)
    log "etcd $etcd_ver: $((SECONDS - t))s"
  fi
  if [[ $need_kwok -eq 1 ]]; then
    t=$SECONDS
    (cd "$here/kwok" && go build -trimpath -ldflags="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_ver" \
      -o "$tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
    log "kwok $kwok_ver: $((SECONDS - t))s"
  fi
  for f in "$tmp"/*; do mv -f "$f" "$bin/"; done
  log "built in $((SECONDS - start))s"
fi

for f in kube-apiserver kube-controller-manager kube-scheduler etcd kwok; do
  [[ -x "$bin/$f" ]] || { log "missing $bin/$f after build"; exit 1; }
done
[[ -x "$kubectl" ]] || { log "missing kubectl $kubectl after build"; exit 1; }

echo "GDG_K8S_BIN_DIR=$bin"
echo "KUBECTL=$kubectl"
