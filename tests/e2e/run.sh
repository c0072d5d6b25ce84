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
timeout="${GDG_E2E_TIMEOUT:-30m}"
if [[ "${GDG_E2E_SERIAL:-}" == 1 ]]; then
  # One test package at a time, each with one control plane, as before.
  GOFLAGS=-mod=readonly go test -p 1 -count=1 -v -timeout="$timeout" ./... "$@"
  exit
fi

# Concurrent jobs, each with a control plane of its own: the oracle package,
# and the lab package in three parts (without extra arguments; with them, a
# -run of the caller's would override a part's, so the lab runs whole).
# Alone, a job mostly waits (Lease expiry, a watch's debounce, the operator's
# reconciles); side by side, four keep both cores of a 2-core machine busy
# and end in 5 to 6 minutes, against 14 one after another. Within a job the
# tests run one after another, in source order, as before: they share their
# cluster's nodes, webhook configuration and guard; jobs share nothing but
# the machine (each has its own work dir, ports and processes).
#
# Each line of lab_parts is a part, the tests of those files; the tests of
# every other file are one more part. A test added to a listed file runs in
# its part, any other in the last. The parts are about even in wall time
# (240-290 s each beside the others; the oracle's job, 290-310 s, is the
# longest).
lab_parts=(
  "blind_test.go watch_test.go scheduler_test.go"
  "lease_test.go helm_test.go helm_policy_test.go helm_cel_test.go audit_test.go"
)

mapfile -t pkgs < <(GOFLAGS=-mod=readonly go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./...)
lab_pkg="$(GOFLAGS=-mod=readonly go list .)"
# Build every test binary once, before the jobs compile the same packages side by side.
GOFLAGS=-mod=readonly go test -c -o "$GDG_E2E_WORKDIR/test-bin/" "${pkgs[@]}" >/dev/null

# tests_of FILE...: the regexp matching exactly the tests declared in them.
tests_of() {
  echo "^($(sed -n 's/^func \(Test[A-Za-z0-9_]*\)(t \*testing\.T).*/\1/p' "$@" | paste -sd'|'))\$"
}

names=()
args=()
for pkg in "${pkgs[@]}"; do
  if [[ "$pkg" == "$lab_pkg" && $# -eq 0 ]]; then
    listed=()
    for part in "${lab_parts[@]}"; do
      read -ra files <<<"$part"
      ((${#files[@]})) || continue
      listed+=("${files[@]}")
      names+=("lab (${files[*]})")
      args+=("$pkg -run $(tests_of "${files[@]}")")
    done
    names+=("lab (the other files)")
    args+=("$pkg -skip $(tests_of "${listed[@]}")")
  else
    name="${pkg#"$lab_pkg"/}"
    [[ "$pkg" == "$lab_pkg" ]] && name=lab
    names+=("$name")
    args+=("$pkg")
  fi
done

logs="$GDG_E2E_WORKDIR/jobs"
mkdir -p "$logs"
pids=()
# Each job is a process group of its own (set -m while they start): Ctrl-C
# or a TERM to this script reaches go test and the test binary, which stops
# its control plane, through stop_jobs.
stop_jobs() {
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
}
trap 'stop_jobs; exit 130' INT TERM
set -m
for i in "${!names[@]}"; do
  echo "run.sh: job $i started: ${names[$i]}" >&2
  # shellcheck disable=SC2086 # args[i] is a package and its -run/-skip, no spaces inside.
  (
    t0=$SECONDS
    rc=0
    GOFLAGS=-mod=readonly go test -count=1 -v -timeout="$timeout" ${args[$i]} "$@" >"$logs/$i.log" 2>&1 || rc=$?
    echo "$rc $((SECONDS - t0))" >"$logs/$i.rc"
  ) &
  pids+=($!)
done
set +m

# Each job's output in full as it ends (the jobs' lines would interleave).
rc=0
summary=()
remaining=("${!names[@]}")
while ((${#remaining[@]})); do
  sleep 1
  still=()
  for i in "${remaining[@]}"; do
    if [[ -e "$logs/$i.rc" ]]; then
      read -r code took <"$logs/$i.rc"
      echo "=== run.sh: job $i, ${names[$i]}: exit $code after ${took}s ==="
      cat "$logs/$i.log"
      summary+=("run.sh: ${names[$i]}: exit $code after ${took}s")
      ((code == 0)) || rc=1
    else
      still+=("$i")
    fi
  done
  remaining=("${still[@]}")
done
printf '%s\n' "${summary[@]}" >&2
exit $rc
