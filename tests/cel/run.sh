#!/usr/bin/env bash
# End-to-end test of deploy/cel against a real kube-apiserver, through real
# kubectl: starts etcd and kube-apiserver on free loopback ports with a CA and
# certificates made here by openssl, applies the policy, creates the lab
# nodes from tests/fixtures/nodes/ and labels them as people would.
#
#   tests/cel/run.sh
#
# Binaries: $GDG_K8S_BIN_DIR (kube-apiserver and etcd), else the e2e suite's
# cache ${GDG_CACHE:-~/.cache/gpu-deploy-guard}/k8s-*/bin, else whatever
# tests/e2e/build-control-plane.sh builds when it is present. kubectl:
# $KUBECTL, else the gcloud SDK's kubectl.1.33, else kubectl on PATH.
#
# Ends with "N passed, M failed"; exits 1 on any failure, 2 when it cannot
# start. Every process it starts is stopped on exit.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
started=$SECONDS
log() { echo "cel: $*" >&2; }
die() { log "$*"; exit 2; }

# --- binaries ---------------------------------------------------------------
bin=${GDG_K8S_BIN_DIR:-}
if [[ -z $bin ]]; then
  # Newest version first; an unmatched glob stays literal and fails -x.
  for d in $(printf '%s\n' "${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"/k8s-*/bin | sort -rV); do
    if [[ -x $d/kube-apiserver && -x $d/etcd ]]; then bin=$d; break; fi
  done
fi
if [[ -z $bin && -x tests/e2e/build-control-plane.sh ]]; then
  log "no cached control plane; building it with tests/e2e/build-control-plane.sh (slow the first time)"
  eval "$(tests/e2e/build-control-plane.sh | grep -E '^(GDG_K8S_BIN_DIR|KUBECTL)=')" || die "control plane build failed"
  bin=${GDG_K8S_BIN_DIR:-}
fi
[[ -n $bin && -x $bin/kube-apiserver && -x $bin/etcd ]] ||
  die "no kube-apiserver and etcd found: set GDG_K8S_BIN_DIR, or build them with tests/e2e/build-control-plane.sh"
kubectl=${KUBECTL:-}
if [[ -z $kubectl ]]; then
  for k in /usr/lib/google-cloud-sdk/bin/kubectl.1.33 "$bin/kubectl" kubectl; do
    if command -v "$k" >/dev/null; then kubectl=$(command -v "$k"); break; fi
  done
fi
[[ -n $kubectl ]] || die "no kubectl: set KUBECTL"
command -v openssl >/dev/null || die "openssl is missing"

# --- scratch directory and clean-up -----------------------------------------
work=$(mktemp -d /tmp/gdg-cel.XXXXXX)
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  if [[ ${KEEP:-} == 1 ]]; then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- PKI ------------------------------------------------------------------------
pki=$work/pki
mkdir -p "$pki"
{
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 \
    -subj "/CN=gdg-cel-test-ca" -keyout "$pki/ca.key" -out "$pki/ca.crt"
  leaf() { # name subject extensions
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -subj "$2" -keyout "$pki/$1.key" -out "$pki/$1.csr"
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
      -CAcreateserial -days 1 -extfile <(printf '%s\n' "$3") -out "$pki/$1.crt"
  }
  leaf apiserver "/CN=kube-apiserver" \
    "subjectAltName=IP:127.0.0.1,DNS:localhost
extendedKeyUsage=serverAuth"
  # system:masters: may do anything, including impersonating the operator's
  # service account and a kubelet.
  leaf admin "/O=system:masters/CN=cel-test-admin" "extendedKeyUsage=clientAuth"
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$pki/sa.key"
  openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub"
} >"$work/openssl.log" 2>&1 || { cat "$work/openssl.log" >&2; die "openssl failed"; }

# --- etcd and kube-apiserver on free loopback ports -------------------------
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
etcd_port=$(free_port) peer_port=$(free_port) api_port=$(free_port)
[[ $etcd_port != "$peer_port" && $peer_port != "$api_port" && $etcd_port != "$api_port" ]] ||
  die "could not pick three distinct free ports"

"$bin/etcd" --name=cel --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$peer_port" --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
  --initial-cluster="cel=http://127.0.0.1:$peer_port" --initial-cluster-state=new \
  --unsafe-no-fsync=true --log-outputs=stderr >"$work/etcd.log" 2>&1 &
pids+=($!)

"$bin/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 --secure-port="$api_port" \
  --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
  --cert-dir="$work/apiserver-certs" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.96.0.0/16 \
  --enable-admission-plugins=ValidatingAdmissionPolicy >"$work/apiserver.log" 2>&1 &
pids+=($!)

export KUBECONFIG=$work/kubeconfig
cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: cel
    cluster:
      server: https://127.0.0.1:$api_port
      certificate-authority: $pki/ca.crt
users:
  - name: admin
    user:
      client-certificate: $pki/admin.crt
      client-key: $pki/admin.key
contexts:
  - name: cel
    context: { cluster: cel, user: admin }
current-context: cel
EOF
k() { "$kubectl" --cache-dir="$work/kubectl-cache" "$@"; }

# Poll until true or the deadline; $1 seconds, then a command.
wait_for() {
  local deadline=$((SECONDS + $1)); shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.5
  done
}
alive() { local pid; for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null || return 1; done; }

ready() { alive && [[ $(k get --raw /readyz 2>/dev/null) == ok ]]; }
if ! wait_for 90 ready; then
  log "kube-apiserver did not become ready; last lines of its log and etcd's:"
  tail -15 "$work/apiserver.log" "$work/etcd.log" >&2
  die "control plane failed to start"
fi
log "kube-apiserver $(k version -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])') ready on 127.0.0.1:$api_port after $((SECONDS - started))s"

# --- the cluster under test -------------------------------------------------
# The identities the policy exempts need RBAC to change nodes at all, as they
# have in a real cluster (the operator's ClusterRole, the kubelet's).
setup_err=$work/setup.err
{
  k apply -k deploy/cel &&
  k apply -f - <<'EOF' &&
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: cel-test-node-labeller
rules:
  - apiGroups: [""]
    resources: ["nodes"]
    verbs: ["get", "list", "patch", "update"]
  - apiGroups: ["nvidia.com"]
    resources: ["clusterpolicies"]
    verbs: ["get", "list", "patch", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: cel-test-node-labeller
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: cel-test-node-labeller
subjects:
  - kind: ServiceAccount
    name: gpu-operator
    namespace: gpu-operator
  - kind: ServiceAccount
    name: default
    namespace: gpu-operator-resources
  - kind: Group
    apiGroup: rbac.authorization.k8s.io
    name: system:nodes
EOF
  k create -f tests/fixtures/nodes/lab-node-0.yaml -f tests/fixtures/nodes/lab-node-1.yaml \
    -f tests/fixtures/nodes/lab-node-2.yaml
} >"$work/setup.log" 2>"$setup_err" || { cat "$work/setup.log" "$setup_err" >&2; die "setting up the cluster failed"; }

# The API server picks up a new policy and binding through an informer, so
# the first requests after `apply` may not see it. Probe with a server-side
# dry run of a change it must refuse until it does.
policy_active() {
  ! k label node lab-node-2 nvidia.com/gpu.deploy.device-plugin=true --dry-run=server >/dev/null 2>"$work/probe.err" &&
    grep -q "ValidatingAdmissionPolicy 'gpu-deploy-guard-device-plugin-needs-toolkit'" "$work/probe.err"
}
t0=$SECONDS
wait_for 60 policy_active || { cat "$work/probe.err" >&2; die "the policy did not become active within 60s"; }
log "policy active after $((SECONDS - t0))s"

# --- cases ------------------------------------------------------------------
passed=0 failed=0
pass() { passed=$((passed + 1)); echo "ok   $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

label_of() { # node key -> value, or <unset>
  k get node "$1" -o json | python3 -c '
import json, sys
labels = json.load(sys.stdin)["metadata"].get("labels", {})
print(labels.get(sys.argv[1], "<unset>"))' "$2"
}

# expect_allowed NAME NODE-KEY=VALUE-TO-CHECK -- kubectl args...
expect_allowed() {
  local name=$1 node=$2 key=$3 want=$4; shift 5
  local out
  if ! out=$(k "$@" 2>&1); then
    fail "$name" "kubectl $* was refused:" "$out"
    return
  fi
  local got
  got=$(label_of "$node" "$key")
  if [[ $got != "$want" ]]; then
    fail "$name" "allowed, but $node $key=$got, want $want"
    return
  fi
  pass "$name"
}

# expect_denied NAME NODE KEY VALUE-THAT-MUST-STAY MESSAGE -- kubectl args...
expect_denied() {
  local name=$1 node=$2 key=$3 want=$4 message=$5; shift 6
  local out
  if out=$(k "$@" 2>&1); then
    fail "$name" "kubectl $* was allowed:" "$out"
    return
  fi
  if [[ $out != *"ValidatingAdmissionPolicy 'gpu-deploy-guard-device-plugin-needs-toolkit'"*"denied request: $message"* ]]; then
    fail "$name" "refused, but not with the expected message:" "got:  $out" "want: ...denied request: $message"
    return
  fi
  local got
  got=$(label_of "$node" "$key")
  if [[ $got != "$want" ]]; then
    fail "$name" "refused, but $node $key=$got, want $want"
    return
  fi
  pass "$name"
}

P=nvidia.com/gpu.deploy.device-plugin
T=nvidia.com/gpu.deploy.container-toolkit

expect_denied "lab-node-2: device-plugin=true alone is refused" \
  lab-node-2 "$P" "<unset>" \
  "node lab-node-2: $P=true would run the NVIDIA device plugin without the container toolkit ($T is not set), so GPU pods would be scheduled there and fail to start; set $T=true in the same command, or leave the device plugin off ($P=false)." \
  -- label node lab-node-2 "$P=true"

expect_allowed "lab-node-1: dcgm-exporter=false passes" \
  lab-node-1 nvidia.com/gpu.deploy.dcgm-exporter false \
  -- label node lab-node-1 nvidia.com/gpu.deploy.dcgm-exporter=false --overwrite

expect_denied "lab-node-0: removing the toolkit label is refused" \
  lab-node-0 "$T" true \
  "node lab-node-0: $P=true would run the NVIDIA device plugin without the container toolkit (this request removes $T), so GPU pods would be scheduled there and fail to start; keep $T=true, or turn the device plugin off in the same command with $P=false." \
  -- label node lab-node-0 "$T-"

expect_denied "lab-node-1: a toolkit value other than \"true\" is refused" \
  lab-node-1 "$T" true \
  "node lab-node-1: $P=true would run the NVIDIA device plugin without the container toolkit (this request sets $T=\"paused-for-driver-upgrade\"), so GPU pods would be scheduled there and fail to start; keep $T=true, or turn the device plugin off in the same command with $P=false." \
  -- label node lab-node-1 "$T=paused-for-driver-upgrade" --overwrite

expect_allowed "lab-node-0: device plugin and toolkit off together pass" \
  lab-node-0 "$T" false \
  -- label node lab-node-0 "$P=false" "$T=false" --overwrite

expect_allowed "lab-node-0: device plugin and toolkit back on together pass" \
  lab-node-0 "$P" true \
  -- label node lab-node-0 "$P=true" "$T=true" --overwrite

expect_allowed "the GPU Operator's service account is exempt" \
  lab-node-2 "$P" true \
  -- label node lab-node-2 "$P=true" --as=system:serviceaccount:gpu-operator:gpu-operator

expect_allowed "an already broken node accepts an unrelated label" \
  lab-node-2 example.com/team ml \
  -- label node lab-node-2 example.com/team=ml

if out=$(k cordon lab-node-2 2>&1) &&
  [[ $(k get node lab-node-2 -o jsonpath='{.spec.unschedulable}') == true ]]; then
  pass "an already broken node can be cordoned"
else
  fail "an already broken node can be cordoned" "$out"
fi

expect_allowed "an already broken node can be repaired" \
  lab-node-2 "$T" true \
  -- label node lab-node-2 "$T=true"

expect_allowed "a kubelet (group system:nodes) is exempt" \
  lab-node-1 "$T" "<unset>" \
  -- label node lab-node-1 "$T-" --as=system:node:lab-node-1 --as-group=system:nodes

# CREATE is never judged: node registration must not depend on deploy labels.
create_only_plugin() {
  k create -f - <<EOF
apiVersion: v1
kind: Node
metadata:
  name: lab-node-3
  labels:
    $P: "true"
EOF
}
if out=$(create_only_plugin 2>&1) && [[ $(label_of lab-node-3 "$P") == true ]]; then
  pass "creating a node with only device-plugin=true passes"
else
  fail "creating a node with only device-plugin=true passes" "$out"
fi

# Only the operator's own namespace is exempt. Older GPU Operator releases
# installed into gpu-operator-resources; its service accounts are judged.
expect_denied "a service account of gpu-operator-resources is not exempt" \
  lab-node-0 "$T" true \
  "node lab-node-0: $P=true would run the NVIDIA device plugin without the container toolkit (this request removes $T), so GPU pods would be scheduled there and fail to start; keep $T=true, or turn the device plugin off in the same command with $P=false." \
  -- label node lab-node-0 "$T-" --as=system:serviceaccount:gpu-operator-resources:default

# --- ClusterPolicy: the toolkit switched off under an enabled device plugin -
# The GPU Operator's ClusterPolicy kind (a schemaless stand-in) and one policy.
cp_name=cluster-policy
cp_manifest="apiVersion: nvidia.com/v1
kind: ClusterPolicy
metadata:
  name: $cp_name
spec:
  toolkit:
    enabled: true
  devicePlugin:
    enabled: true"
if k apply -f tests/e2e/testdata/watched-crds.yaml >"$work/crds.log" 2>&1 &&
   k wait --for=condition=Established crd/clusterpolicies.nvidia.com --timeout=60s >>"$work/crds.log" 2>&1 &&
   wait_for 60 k get clusterpolicies.nvidia.com &&
   printf '%s\n' "$cp_manifest" | k create -f - >>"$work/crds.log" 2>&1
then
  cp_policy_active() {
    ! k patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":false}}}' --dry-run=server \
      >/dev/null 2>"$work/cp-probe.err" &&
      grep -q "ValidatingAdmissionPolicy 'gpu-deploy-guard-cluster-policy-keeps-toolkit'" "$work/cp-probe.err"
  }
  if wait_for 60 cp_policy_active; then
    pass "ClusterPolicy: toolkit.enabled true -> false is refused while the device plugin stays enabled"
    if grep -q "denied request: ClusterPolicy $cp_name: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin stays enabled" "$work/cp-probe.err" &&
       grep -q "gpu-deploy-guard.nvidia.com/toolkit-on-hosts=<why>" "$work/cp-probe.err"; then
      pass "ClusterPolicy: the refusal says what breaks and how to say the hosts bring the toolkit"
    else
      fail "ClusterPolicy: the refusal says what breaks and how to say the hosts bring the toolkit" "$(cat "$work/cp-probe.err")"
    fi
  else
    fail "ClusterPolicy: toolkit.enabled true -> false is refused while the device plugin stays enabled" "$(cat "$work/cp-probe.err")"
  fi
  cp_field() { k get clusterpolicy "$cp_name" -o "jsonpath=$1"; }
  cp_case() { # NAME WANT(allowed|denied) -- kubectl args...
    local name=$1 want=$2; shift 3
    local out
    if out=$(k "$@" 2>&1); then
      if [[ $want == allowed ]]; then pass "$name"; else fail "$name" "allowed: $out"; fi
    elif [[ $want == denied && $out == *"ValidatingAdmissionPolicy 'gpu-deploy-guard-cluster-policy-keeps-toolkit'"* ]]; then
      pass "$name"
    else
      fail "$name" "refused: $out"
    fi
  }
  cp_case "ClusterPolicy: toolkit and device plugin off together pass" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":false},"devicePlugin":{"enabled":false}}}'
  cp_case "ClusterPolicy: both back on pass" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":true},"devicePlugin":{"enabled":true}}}'
  cp_case "ClusterPolicy: the GPU Operator's service account is exempt" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":false}}}' --dry-run=server \
    --as=system:serviceaccount:gpu-operator:gpu-operator
  cp_case "ClusterPolicy: toolkit-on-hosts set in the same request lets it through" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge \
    -p '{"metadata":{"annotations":{"gpu-deploy-guard.nvidia.com/toolkit-on-hosts":"in the node image"}},"spec":{"toolkit":{"enabled":false}}}'
  if [[ $(cp_field '{.spec.toolkit.enabled}') == false ]]; then
    pass "ClusterPolicy: the allowed change is stored"
  else
    fail "ClusterPolicy: the allowed change is stored" "toolkit.enabled=$(cp_field '{.spec.toolkit.enabled}')"
  fi
  cp_case "ClusterPolicy: toolkit back on passes" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":true}}}'
  cp_case "ClusterPolicy: an annotation left from an earlier request does not say it again" denied \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"toolkit":{"enabled":false}}}'
  cp_case "ClusterPolicy: an unrelated change passes" allowed \
    -- patch clusterpolicy "$cp_name" --type=merge -p '{"spec":{"operator":{"defaultRuntime":"containerd"}}}'
else
  fail "ClusterPolicy cases: set-up" "$(cat "$work/crds.log")"
fi

# The dry rollout the README describes: with [Warn, Audit] the same change
# goes through, and kubectl prints the denial as a warning. The binding
# change reaches the policy informer asynchronously too.
warn_text="node lab-node-0: $P=true would run the NVIDIA device plugin without the container toolkit (this request removes $T), so GPU pods would be scheduled there and fail to start; keep $T=true, or turn the device plugin off in the same command with $P=false."
warns() { # kubectl args...: allowed, with the policy's warning
  out=$(k "$@" 2>&1) &&
    [[ $out == *"Warning: Validation failed for ValidatingAdmissionPolicy 'gpu-deploy-guard-device-plugin-needs-toolkit'"*"$warn_text"* ]]
}
if k patch validatingadmissionpolicybinding gpu-deploy-guard-device-plugin-needs-toolkit --type=merge \
     -p '{"spec":{"validationActions":["Warn","Audit"]}}' >"$work/patch.log" 2>&1 &&
   wait_for 60 warns label node lab-node-0 "$T-" --dry-run=server; then
  if warns label node lab-node-0 "$T-" && [[ $(label_of lab-node-0 "$T") == "<unset>" ]]; then
    pass "with [Warn, Audit] the change passes with the message as a warning"
  else
    fail "with [Warn, Audit] the change passes with the message as a warning" "$out"
  fi
else
  fail "with [Warn, Audit] the change passes with the message as a warning" "$(cat "$work/patch.log")" "$out"
fi

log "took $((SECONDS - started))s"
echo "$passed passed, $failed failed"
[[ $failed == 0 ]]
