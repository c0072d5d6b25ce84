#!/usr/bin/env bash
# Tests of deploy/monitoring: the alert rules of the guard and of the GPU
# telemetry (promtool check + unit tests), the example Alertmanager
# configuration (amtool check-config, amtool config routes test, and its
# inhibition in a local Alertmanager), the generated PrometheusRules and
# dashboard ConfigMap, the Grafana JSON, and
# the metric names used everywhere.
#
#   tests/monitoring/run.sh
#
# Installs what it needs when it is missing and it runs as root on Debian
# (as CI does): promtool from Debian's `prometheus` package, amtool from
# `prometheus-alertmanager`, and PyYAML from `python3-yaml`. Ends with "N passed, M failed" and exits 1 on any failure.
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root" || exit 2
mon=deploy/monitoring
here=tests/monitoring

die() { echo "monitoring tests: $*" >&2; exit 2; }

apt_install() {
  if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
    die "cannot install $* (needs root and apt-get); install it yourself or put promtool and amtool on PATH"
  fi
  echo "== installing $* with apt-get"
  # Debian's prometheus and prometheus-alertmanager packages start their
  # servers from their postinst. We only want promtool and amtool: on a
  # machine without a policy-rc.d (container images ship one), forbid
  # service starts for this install.
  local policy=/usr/sbin/policy-rc.d made_policy=
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
  fi
  local rc=0
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"; } >/tmp/gdg-monitoring-apt.log 2>&1 || rc=$?
  [[ -n $made_policy ]] && rm -f "$policy"
  if [[ $rc != 0 ]]; then
    tail -20 /tmp/gdg-monitoring-apt.log >&2
    die "apt-get install $* failed"
  fi
}

# promtool and amtool, from Debian's prometheus and prometheus-alertmanager
# packages, in one apt-get run.
want=()
command -v promtool >/dev/null || want+=(prometheus)
command -v amtool >/dev/null || want+=(prometheus-alertmanager)
[[ ${#want[@]} -gt 0 ]] && apt_install "${want[@]}"
command -v promtool >/dev/null || die "promtool still missing after installing prometheus"
command -v amtool >/dev/null || die "amtool still missing after installing prometheus-alertmanager"

# The first python3 with PyYAML: pyenv's, else Debian's.
python=
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c 'import yaml' 2>/dev/null; then python=$p; break; fi
done
if [[ -z $python ]]; then
  apt_install python3-yaml
  python=/usr/bin/python3
  "$python" -c 'import yaml' || die "PyYAML still missing after installing python3-yaml"
fi

echo "== $(promtool --version 2>&1 | head -1)"

# shellcheck source=tests/lib/check.sh
source tests/lib/check.sh
skipped=0

check "promtool check rules" promtool check rules --lint-fatal "$mon/rules/gpu-deploy-guard.rules.yaml"
check "promtool test rules (alerts_test.yaml)" promtool test rules "$here/alerts_test.yaml"
check "promtool check rules (gpu-telemetry)" promtool check rules --lint-fatal "$mon/rules/gpu-telemetry.rules.yaml"
check "promtool test rules (gpu_telemetry_test.yaml)" promtool test rules "$here/gpu_telemetry_test.yaml"
check "every alert fires in a test and stays silent in another" "$python" "$here/check.py" alert-coverage
check "every GPU telemetry alert has a runbook in docs/troubleshooting.md" "$python" "$here/check.py" telemetry-runbooks
check "the PrometheusRules are rendered from the rule files" "$mon/render-prometheusrule.sh" --check
check "PrometheusRule specs equal the rule files" "$python" "$here/check.py" crd
check "grafana-dashboard.json parses" "$python" -m json.tool "$mon/grafana-dashboard.json"
check "dashboard structure and data source" "$python" "$here/check.py" dashboard
check "grafana-dashboard.yaml is rendered from the JSON" "$mon/render-dashboard-configmap.sh" --check
check "dashboard ConfigMap carries the JSON" "$python" "$here/check.py" configmap
check "rules and dashboard use only exported metric names" "$python" "$here/check.py" metric-names

# The example Alertmanager configuration: valid, routes each case of
# alertmanager_routes.txt to exactly its receiver, and inhibits as meant.
am_config="$mon/alertmanager.yaml"
check "amtool check-config alertmanager.yaml" amtool check-config "$am_config"
routes=0
while read -r receiver labels; do
  [[ -z $receiver || $receiver == \#* ]] && continue
  routes=$((routes + 1))
  # shellcheck disable=SC2086 # one argument per label
  check "route $labels -> $receiver" \
    amtool config routes test --config.file="$am_config" --verify.receivers="$receiver" $labels
done <"$here/alertmanager_routes.txt"
[[ $routes -gt 0 ]] || { failed=$((failed + 1)); echo "FAIL no route cases in alertmanager_routes.txt"; }
alertmanager=$(command -v prometheus-alertmanager || command -v alertmanager || true)
if [[ -n $alertmanager ]]; then
  check "inhibition in a running Alertmanager" "$python" "$here/inhibition.py" "$alertmanager" "$am_config"
else
  skipped=$((skipped + 1))
  echo "skip inhibition in a running Alertmanager (no alertmanager binary)"
fi

kubectl=${KUBECTL:-}
if [[ -z $kubectl ]]; then
  for k in /usr/lib/google-cloud-sdk/bin/kubectl.1.33 kubectl; do
    if command -v "$k" >/dev/null; then kubectl=$k; break; fi
  done
fi
if [[ -n $kubectl ]]; then
  check "kubectl kustomize deploy/monitoring" "$kubectl" kustomize "$mon"
else
  skipped=$((skipped + 1))
  echo "skip kubectl kustomize deploy/monitoring (no kubectl)"
fi

if [[ $skipped -gt 0 ]]; then
  echo "$passed passed, $failed failed, $skipped skipped"
else
  echo "$passed passed, $failed failed"
fi
[[ $failed == 0 ]]
