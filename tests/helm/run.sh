#!/usr/bin/env bash
# Offline tests of the Helm chart and of every manifest rendered from it.
#
#   tests/helm/run.sh
#
# - helm lint --strict for a matrix of value sets;
# - values.schema.json rejects wrong types, unknown enum values and unknown
#   keys, naming the value;
# - deploy/render-manifests.sh --check: the plain manifests in deploy/ are
#   what the chart renders now;
# - every object of every value set, of the kustomize base and overlays, of
#   deploy/cel and deploy/monitoring, is valid: built-in kinds against the
#   Kubernetes 1.34 OpenAPI schemas (PyPI kubernetes-validate, strict), the
#   cert-manager and prometheus-operator kinds against their CRDs' schemas,
#   and RBAC names a wgpolicyk8s resource its CRD defines. The CRDs come from
#   the projects' Go modules (go mod download, pinned below);
# - operatorNamespace reaches every place that names the operator namespace.
#
# Installs what it needs into ${GDG_CACHE:-~/.cache/gpu-deploy-guard}: helm
# (tests/helm/build-helm.sh), a Python venv with kubernetes-validate, and the
# CRD modules in the Go module cache. kubectl (for kustomize) comes from
# tests/e2e/build-control-plane.sh. Ends with "N passed, M failed".
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
here=tests/helm
chart=deploy/helm/gpu-deploy-guard
cache="${GDG_CACHE:-$HOME/.cache/gpu-deploy-guard}"
die() { echo "helm tests: $*" >&2; exit 2; }
start=$SECONDS

K8S_SCHEMA_VERSION=1.34.0
KUBERNETES_VALIDATE=1.34.1
CRD_MODULES=(
  github.com/cert-manager/cert-manager@v1.21.2
  github.com/prometheus-operator/prometheus-operator@v0.85.0
  github.com/kyverno/kyverno@v1.19.1
  github.com/openreports/reports-api@v0.2.1
)

HELM="$("$here/build-helm.sh" | sed -n 's/^HELM=//p')"
[[ -x "$HELM" ]] || die "no helm after build-helm.sh"
export HELM
# kubectl only renders kustomizations here: $KUBECTL, else the gcloud SDK's,
# else the one build-control-plane.sh provides (building it if need be).
if [[ -z "${KUBECTL:-}" && -x /usr/lib/google-cloud-sdk/bin/kubectl.1.33 ]]; then
  KUBECTL=/usr/lib/google-cloud-sdk/bin/kubectl.1.33
elif [[ -z "${KUBECTL:-}" ]]; then
  KUBECTL="$(bash tests/e2e/build-control-plane.sh | sed -n 's/^KUBECTL=//p')"
fi
[[ -x "$KUBECTL" ]] || die "no kubectl from build-control-plane.sh"

venv="$cache/pyvenv-kubernetes-validate-$KUBERNETES_VALIDATE"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
  echo "== installing kubernetes-validate==$KUBERNETES_VALIDATE into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv" && "$venv/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE" ||
    die "pip install kubernetes-validate failed"
fi
py="$venv/bin/python"

crds=()
for mod in "${CRD_MODULES[@]}"; do
  dir="$(GOFLAGS=-mod=mod go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$dir" ]] || die "go mod download $mod gave no directory"
  case "$mod" in
    github.com/cert-manager/*) crds+=("$dir"/deploy/crds/cert-manager.io_{issuers,clusterissuers,certificates}.yaml) ;;
    github.com/prometheus-operator/*) crds+=("$dir"/example/prometheus-operator-crd/monitoring.coreos.com_{servicemonitors,prometheusrules}.yaml) ;;
    github.com/kyverno/*) crds+=("$dir"/config/crds/policyreport/wgpolicyk8s.io_clusterpolicyreports.yaml) ;;
    github.com/openreports/*) crds+=("$dir"/config/crd/openreports.io_clusterreports.yaml) ;;
  esac
done
for f in "${crds[@]}"; do [[ -f "$f" ]] || die "missing CRD file $f"; done

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# shellcheck source=tests/lib/check.sh
source tests/lib/check.sh

# Value sets: name and helm arguments. Each is linted, rendered and validated.
declare -A sets=(
  [defaults]=""
  [audit]="--set enforcement=audit"
  [warn]="--set enforcement=warn"
  [cert-manager]="--set certificates.mode=cert-manager"
  [cert-manager-clusterissuer]="--set certificates.mode=cert-manager --set certificates.certManager.issuerRef.kind=ClusterIssuer --set certificates.certManager.issuerRef.name=corp-ca"
  [existing-secret]="--set certificates.mode=existingSecret --set certificates.secretName=my-tls --set certificates.existingSecret.caBundle=$(printf 'not a real CA' | base64)"
  [everything]="--set namespace.create=true --set monitoring.gpuTelemetry.enabled=true --set monitoring.gpuTelemetry.serviceMonitor.enabled=true --set monitoring.alertmanagerConfig.enabled=true --set monitoring.serviceMonitor.enabled=true --set monitoring.serviceMonitor.labels.release=kube-prometheus-stack --set monitoring.prometheusRule.enabled=true --set monitoring.prometheusRule.labels.release=kube-prometheus-stack --set monitoring.dashboard.enabled=true --set monitoring.dashboard.namespace=grafana --set monitoring.dashboard.annotations.grafana_folder=GPU --set celPolicy.enabled=true --set celPolicy.clusterPolicyParam=true --set report=true --set networkPolicy.apiServerCIDRs={10.0.0.0/16} --set networkPolicy.metricsPodSelector.app=prometheus --set image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef --set priorityClass.create=false --set priorityClass.name=system-cluster-critical --set tolerations[0].operator=Exists --set config.exemptions.usernames={alice} --set operatorNamespace=nvidia-gpu-operator --set operatorVersion=v25.3.4"
  [host-network]="--set namespace.create=true --set webhook.hostNetwork=true --set webhook.port=9443 --set admin.port=9444 --set admin.bindAddress=0.0.0.0 --set webhook.servicePort=443 --set networkPolicy.enabled=false --set clusterWatch=false --set podDisruptionBudget.enabled=false --set webhook.statusSubresource=false"
  [gke-private]="--set webhook.port=10250"
  [openreports]="--set report=true --set reportFormat=openreports"
  [no-events]="--set events.enabled=false"
  [events-window]="--set events.rateLimit=1h"
  [client-ca]="--set clientCA.secretName=apiserver-client-ca --set clientCA.allowedNames={kube-apiserver,apiserver.example}"
  [gpu-telemetry]="--set monitoring.gpuTelemetry.enabled=true --set monitoring.gpuTelemetry.serviceMonitor.enabled=true --set monitoring.alertmanagerConfig.enabled=true"
  [gpu-telemetry-tuned]="--set monitoring.gpuTelemetry.enabled=true --set monitoring.gpuTelemetry.dcgmExporterJob=dcgm --set monitoring.gpuTelemetry.team=gpu-infra --set monitoring.gpuTelemetry.scrape.enabled=false --set monitoring.gpuTelemetry.health.xidCritical=48|79 --set monitoring.gpuTelemetry.health.xidIgnored=13 --set monitoring.gpuTelemetry.health.eccDoubleBitErrors=2 --set monitoring.gpuTelemetry.health.retiredPagesPending=3 --set-json monitoring.gpuTelemetry.health.thermalViolationRatio=0.25 --set-json monitoring.gpuTelemetry.health.powerViolationRatio=0.75 --set-json monitoring.gpuTelemetry.health.violationCounterUnitSeconds=1e-6 --set monitoring.gpuTelemetry.health.nvlinkCrcErrors=1000 --set monitoring.gpuTelemetry.serviceMonitor.enabled=true --set monitoring.gpuTelemetry.serviceMonitor.namespace=monitoring --set monitoring.alertmanagerConfig.enabled=true --set monitoring.alertmanagerConfig.secretName=alertmanager-main --set monitoring.alertmanagerConfig.namespace=monitoring"
  [gpu-telemetry-health-only]="--set monitoring.gpuTelemetry.enabled=true --set monitoring.gpuTelemetry.sentinels.enabled=false --set monitoring.gpuTelemetry.scrape.enabled=false"
  [gpu-telemetry-no-groups]="--set monitoring.gpuTelemetry.enabled=true --set monitoring.gpuTelemetry.sentinels.enabled=false --set monitoring.gpuTelemetry.scrape.enabled=false --set monitoring.gpuTelemetry.health.enabled=false"
)

manifests=()
for name in $(printf '%s\n' "${!sets[@]}" | sort); do
  # shellcheck disable=SC2086 # word splitting of the value set is intended
  check "helm lint --strict ($name)" "$HELM" lint --strict "$chart" --namespace gpu-deploy-guard --kube-version "$K8S_SCHEMA_VERSION" ${sets[$name]}
  # shellcheck disable=SC2086
  if "$HELM" template gpu-deploy-guard "$chart" --namespace gpu-deploy-guard --kube-version "$K8S_SCHEMA_VERSION" ${sets[$name]} >"$work/$name.yaml" 2>"$work/$name.err"; then
    manifests+=("$work/$name.yaml")
  else
    failed=$((failed + 1)); echo "FAIL helm template ($name)"; sed 's/^/     /' "$work/$name.err"
  fi
done

# The schema refuses bad values, and says which.
rejects() {
  local want=$1; shift
  local out
  if out=$("$HELM" template gpu-deploy-guard "$chart" --kube-version "$K8S_SCHEMA_VERSION" "$@" 2>&1); then
    echo "helm template $* was accepted"; return 1
  fi
  grep -qF -- "$want" <<<"$out" || { echo "error does not mention $want:"; echo "$out"; return 1; }
}
check "schema: enforcement=block is refused" rejects "enforcement" --set enforcement=block
check "schema: replicaCount=two is refused" rejects "replicaCount" --set-string replicaCount=two
check "schema: certificates.mode=vault is refused" rejects "certificates/mode" --set certificates.mode=vault
check "schema: issuerRef.kind=Vault is refused" rejects "certificates/certManager/issuerRef/kind" --set certificates.certManager.issuerRef.kind=Vault
check "schema: webhook.port=70000 is refused" rejects "webhook/port" --set webhook.port=70000
check "schema: webhook.hostNetwork=yes (string) is refused" rejects "webhook/hostNetwork" --set-string webhook.hostNetwork=yes
check "schema: a rule action block is refused" rejects "config/rules/device-plugin-without-toolkit" --set config.rules.device-plugin-without-toolkit=block
check "schema: events.rateLimit=soon is refused" rejects "events/rateLimit" --set events.rateLimit=soon
check "schema: events.rateLimit=500ms (under 1s) is refused" rejects "events/rateLimit" --set events.rateLimit=500ms
check "schema: an unknown rule id is refused" rejects "device-plugin-without-tookit" --set config.rules.device-plugin-without-tookit=deny
check "schema: an unknown top-level value is refused" rejects "enforcment" --set enforcment=audit
check "schema: validationActions Block is refused" rejects "celPolicy/validationActions" --set "celPolicy.validationActions={Deny,Block}"
check "schema: operatorNamespace with capitals is refused" rejects "operatorNamespace" --set operatorNamespace=GPU_Operator
check "schema: operatorVersion latest is refused" rejects "operatorVersion" --set operatorVersion=latest
check "schema: a malformed image digest is refused" rejects "image/digest" --set image.digest=latest
check "schema: an XID list that is not numbers is refused" rejects "monitoring/gpuTelemetry/health/xidCritical" --set "monitoring.gpuTelemetry.health.xidCritical=79|.*"
check "schema: a throttling share above 1 is refused" rejects "monitoring/gpuTelemetry/health/thermalViolationRatio" --set-json monitoring.gpuTelemetry.health.thermalViolationRatio=10
check "schema: a threshold given as a string is refused" rejects "monitoring/gpuTelemetry/health/nvlinkCrcErrors" --set-string monitoring.gpuTelemetry.health.nvlinkCrcErrors=100
check "schema: a job name with a quote is refused" rejects "monitoring/gpuTelemetry/dcgmExporterJob" --set 'monitoring.gpuTelemetry.dcgmExporterJob=a"b'

check "deploy/ manifests are rendered from the chart (render-manifests.sh --check)" deploy/render-manifests.sh --check
check "deploy/monitoring PrometheusRules and dashboard are fresh" bash -c \
  'deploy/monitoring/render-prometheusrule.sh --check && deploy/monitoring/render-dashboard-configmap.sh --check'

# kustomize output of what remains of deploy/ as kustomizations.
for k in base overlays/cert-manager cel monitoring; do
  out="$work/kustomize-${k//\//-}.yaml"
  if "$KUBECTL" kustomize "deploy/$k" >"$out" 2>"$out.err"; then
    manifests+=("$out")
  else
    failed=$((failed + 1)); echo "FAIL kubectl kustomize deploy/$k"; sed 's/^/     /' "$out.err"
  fi
done
check "kustomize overlays/cert-manager = deploy/release/cert-manager.yaml, object for object" \
  "$py" "$here/same_objects.py" "$work/kustomize-overlays-cert-manager.yaml" deploy/release/cert-manager.yaml
check "kustomize base = deploy/release/existing-secret.yaml, object for object" \
  "$py" "$here/same_objects.py" "$work/kustomize-base.yaml" deploy/release/existing-secret.yaml

# The reports `audit -o report` prints in each format (the unit tests hold the
# binary's output to these files) are valid objects of their projects' CRDs.
check "every rendered object and the audit's reports are valid (Kubernetes $K8S_SCHEMA_VERSION schemas, cert-manager/prometheus-operator/wgpolicyk8s/openreports CRDs)" \
  "$py" "$here/validate.py" --k8s "$K8S_SCHEMA_VERSION" \
  --require-crd-group cert-manager.io --require-crd-group monitoring.coreos.com --require-crd-group wgpolicyk8s.io \
  --require-crd-group openreports.io \
  $(printf -- '--crd %s ' "${crds[@]}") "${manifests[@]}" deploy/release/*.yaml deploy/monitoring/servicemonitor-dcgm-exporter.yaml \
  tests/fixtures/audit/report-one-node.yaml tests/fixtures/audit/report-one-node.openreports.yaml

check "operatorNamespace=nvidia-gpu-operator reaches every operator-namespace reference" \
  "$py" "$here/same_objects.py" --operator-namespace nvidia-gpu-operator "$work/everything.yaml"

check "values reach the objects they are documented to change" "$py" "$here/values_check.py" "$work"
# The GPU telemetry rules with every threshold changed must still be valid
# PromQL (the chart edits expressions). promtool comes with
# tests/monitoring/run.sh; without it this is skipped, never passed.
if command -v promtool >/dev/null; then
  "$py" -c 'import sys, yaml
objs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
rules = [o for o in objs if o["kind"] == "PrometheusRule" and o["metadata"]["name"].endswith("-gpu-telemetry")]
yaml.safe_dump(rules[0]["spec"] if len(rules) == 1 else {}, open(sys.argv[2], "w"))' \
    "$work/gpu-telemetry-tuned.yaml" "$work/gpu-telemetry-tuned.rules.yaml"
  check "promtool check rules: GPU telemetry rules with tuned values" \
    promtool check rules --lint-fatal "$work/gpu-telemetry-tuned.rules.yaml"
else
  echo "skip promtool check rules: GPU telemetry rules with tuned values (no promtool; tests/monitoring/run.sh installs it)"
fi
check "the krew plugin manifest renders for a release" "$py" "$here/krew_check.py" .krew.yaml

echo "== tests/helm: $passed passed, $failed failed ($((SECONDS - start))s)"
[[ $failed -eq 0 ]]
