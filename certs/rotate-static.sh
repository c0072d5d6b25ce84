#!/usr/bin/env bash
# Rotate the serving certificate (and CA) of a gpu-deploy-guard installed with
# deploy/overlays/static-certs, with no moment at which the API server
# distrusts the webhook.
#
# The API server checks the webhook's certificate against the caBundle of the
# ValidatingWebhookConfiguration. Swapping certificate and bundle together
# would leave a window (the kubelet needs up to a minute or two to update the
# mounted Secret) in which one side is new and the other old; for the
# fail-closed webhook that means refused deploy-label changes. So:
#
#   1. make a new CA and serving certificate with `gpu-deploy-guard certs`
#   2. publish caBundle = the CA(s) trusted now + the new CA
#   3. copy the new files into the overlay directory (so `kubectl apply -k`
#      from now on applies the new certificate, still with both CAs)
#   4. replace the Secret gpu-deploy-guard-tls; the kubelet updates the
#      mounted files and the binary reloads them without a restart
#   5. wait until every webhook pod reports the new certificate's expiry in
#      its metrics (gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds)
#   6. publish caBundle = the new CA only, and regenerate the overlay's patch
#
# If step 5 times out nothing is broken (both CAs are trusted); run the
# script again with --finish once the pods serve the new certificate.
#
# Usage:
#   certs/rotate-static.sh [--overlay DIR] [--context NAME] [--timeout SECONDS]
#   certs/rotate-static.sh --finish [--overlay DIR] [--context NAME] [--timeout SECONDS]
#
# Environment: GDG_BIN (default: gpu-deploy-guard), KUBECTL (default: kubectl).
# Needs: kubectl with rights to patch the webhook configuration, apply the
# Secret and read pods/proxy in namespace gpu-deploy-guard; openssl.
set -euo pipefail
umask 077

NAMESPACE=gpu-deploy-guard
SECRET=gpu-deploy-guard-tls
WEBHOOK_CONFIG=gpu-deploy-guard
WEBHOOKS=(enforce.gpu-deploy-guard.io observe.gpu-deploy-guard.io)
POD_SELECTOR=app.kubernetes.io/name=gpu-deploy-guard,app.kubernetes.io/component=webhook
ADMIN_PORT=8080
EXPIRY_METRIC=gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds
DNS_NAMES=(gpu-deploy-guard.gpu-deploy-guard.svc gpu-deploy-guard.gpu-deploy-guard.svc.cluster.local)

GDG_BIN="${GDG_BIN:-gpu-deploy-guard}"
KUBECTL="${KUBECTL:-kubectl}"

script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
overlay="$script_dir/../deploy/overlays/static-certs"
context=""
timeout=300
finish=false

say() { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die() {
  printf 'rotate-static.sh: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '/^# Usage:/,/^set -euo pipefail/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --overlay) overlay="${2:?--overlay needs a directory}"; shift 2 ;;
    --context) context="${2:?--context needs a name}"; shift 2 ;;
    --timeout) timeout="${2:?--timeout needs seconds}"; shift 2 ;;
    --finish) finish=true; shift ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument: $1" ;;
  esac
done
[[ "$timeout" =~ ^[0-9]+$ ]] || die "--timeout must be a whole number of seconds"

kctl=("$KUBECTL")
[[ -n "$context" ]] && kctl+=(--context "$context")
k() { "${kctl[@]}" "$@"; }

command -v "$KUBECTL" >/dev/null || die "kubectl not found (set KUBECTL)"
command -v openssl >/dev/null || die "openssl not found"
[[ -d "$overlay" ]] || die "overlay directory $overlay does not exist (use --overlay)"
overlay="$(cd "$overlay" && pwd)"
[[ -x "$overlay/set-ca-bundle.sh" ]] || die "$overlay has no set-ca-bundle.sh: is it the static-certs overlay?"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# Seconds since the epoch at which a certificate expires.
not_after_epoch() {
  local end
  end="$(openssl x509 -noout -enddate -in "$1")"
  end="${end#notAfter=}"
  date -u -d "$end" +%s 2>/dev/null ||
    date -u -j -f '%b %e %T %Y %Z' "$end" +%s 2>/dev/null ||
    die "cannot convert '$end' to a timestamp with this system's date"
}

# Current caBundle of one webhook, decoded to PEM on stdout.
current_bundle() {
  local b64
  b64="$(k get validatingwebhookconfiguration "$WEBHOOK_CONFIG" \
    -o jsonpath="{.webhooks[?(@.name==\"$1\")].clientConfig.caBundle}")"
  [[ -n "$b64" ]] || return 0
  printf '%s' "$b64" | openssl base64 -d -A
}

# Set caBundle of both webhooks to the PEM bundle in file $1.
publish_bundle() {
  local b64 patch="$work/patch.json" name sep=""
  b64="$(openssl base64 -A <"$1")"
  {
    printf '{"webhooks":['
    for name in "${WEBHOOKS[@]}"; do
      printf '%s{"name":"%s","clientConfig":{"caBundle":"%s"}}' "$sep" "$name" "$b64"
      sep=","
    done
    printf ']}\n'
  } >"$patch"
  k patch validatingwebhookconfiguration "$WEBHOOK_CONFIG" --type=strategic --patch-file="$patch" >/dev/null
  for name in "${WEBHOOKS[@]}"; do
    [[ "$(k get validatingwebhookconfiguration "$WEBHOOK_CONFIG" \
      -o jsonpath="{.webhooks[?(@.name==\"$name\")].clientConfig.caBundle}")" == "$b64" ]] ||
      die "caBundle of $name did not take the new value"
  done
  note "caBundle now holds $(grep -c -- '-----BEGIN CERTIFICATE-----' "$1") CA certificate(s)"
  # Every API server picks the change up from its watch, normally within a
  # second; leave a margin for HA control planes.
  sleep 5
}

# Wait until every running webhook pod reports expiry $1 (seconds since the
# epoch) for the certificate it serves.
wait_for_pods() {
  local want="$1" deadline pods pod got pending
  deadline=$((SECONDS + timeout))
  say "waiting up to ${timeout}s for every webhook pod to serve the new certificate (expiry $want)"
  while :; do
    pods="$(k -n "$NAMESPACE" get pods -l "$POD_SELECTOR" \
      --field-selector=status.phase=Running -o jsonpath='{.items[*].metadata.name}')"
    [[ -n "$pods" ]] || die "no running webhook pods in namespace $NAMESPACE"
    pending=""
    for pod in $pods; do
      got="$(k get --raw "/api/v1/namespaces/$NAMESPACE/pods/$pod:$ADMIN_PORT/proxy/metrics" 2>/dev/null |
        awk -v m="$EXPIRY_METRIC" '$1 == m { print $2; exit }')" || got=""
      # Gauges may be printed as floats; compare whole seconds.
      got="${got%%.*}"
      [[ "$got" == "$want" ]] || pending+=" $pod(${got:-no metric})"
    done
    if [[ -z "$pending" ]]; then
      note "all pods serve the new certificate: $pods"
      return 0
    fi
    if ((SECONDS >= deadline)); then
      printf 'rotate-static.sh: pods still on another certificate:%s\n' "$pending" >&2
      return 1
    fi
    note "not yet:$pending"
    sleep 10
  done
}

finish_rotation() {
  local want
  [[ -f "$overlay/ca.crt" && -f "$overlay/tls.crt" ]] || die "no ca.crt/tls.crt in $overlay"
  want="$(not_after_epoch "$overlay/tls.crt")"
  [[ "$want" =~ ^[0-9]+$ ]] || die "could not read the expiry of $overlay/tls.crt"
  if ! wait_for_pods "$want"; then
    die "both CAs are still trusted, so nothing is broken. Check the pods and the kubelet, then run: $0 --finish"
  fi
  say "dropping the old CA: caBundle = new CA only"
  publish_bundle "$overlay/ca.crt"
  "$overlay/set-ca-bundle.sh" "$overlay/ca.crt" >/dev/null
  say "done. $overlay now matches the cluster; 'kubectl apply -k $overlay' is safe."
}

if [[ "$(k get validatingwebhookconfiguration "$WEBHOOK_CONFIG" \
  -o jsonpath='{.metadata.annotations.cert-manager\.io/inject-ca-from}')" != "" ]]; then
  die "$WEBHOOK_CONFIG is managed by cert-manager's cainjector; rotate through cert-manager instead"
fi

if $finish; then
  finish_rotation
  exit 0
fi

command -v "$GDG_BIN" >/dev/null || die "$GDG_BIN not found (set GDG_BIN)"

say "reading the CA bundle the API server trusts now"
for name in "${WEBHOOKS[@]}"; do
  current_bundle "$name" >>"$work/current.pem"
done
grep -q -- '-----BEGIN CERTIFICATE-----' "$work/current.pem" ||
  die "$WEBHOOK_CONFIG has no caBundle; install with deploy/overlays/static-certs first (see deploy/README.md)"
# Both webhooks normally carry the same bundle; keep each certificate once.
awk '/-----BEGIN CERTIFICATE-----/ { cert = "" } { cert = cert $0 "\n" }
     /-----END CERTIFICATE-----/ { if (!seen[cert]++) printf "%s", cert }' \
  "$work/current.pem" >"$work/current-unique.pem"
note "$(grep -c -- '-----BEGIN CERTIFICATE-----' "$work/current-unique.pem") CA certificate(s) trusted now"

say "making a new CA and serving certificate with $GDG_BIN certs"
dns_args=()
for name in "${DNS_NAMES[@]}"; do dns_args+=(--dns "$name"); done
"$GDG_BIN" certs --out "$work/new" "${dns_args[@]}" >"$work/certs.log" ||
  { cat "$work/certs.log" >&2; die "gpu-deploy-guard certs failed"; }
for f in ca.crt tls.crt tls.key; do
  [[ -s "$work/new/$f" ]] || die "gpu-deploy-guard certs did not write $f"
done
openssl verify -CAfile "$work/new/ca.crt" "$work/new/tls.crt" >/dev/null ||
  die "the new serving certificate does not verify against the new CA"
note "expires $(openssl x509 -noout -enddate -in "$work/new/tls.crt" | cut -d= -f2)"

say "trusting old and new CA: caBundle = current + new"
cat "$work/current-unique.pem" "$work/new/ca.crt" >"$work/transition.pem"
publish_bundle "$work/transition.pem"

say "writing the new certificate into $overlay"
for f in ca.crt tls.crt tls.key; do
  cp "$work/new/$f" "$overlay/$f"
done
chmod 600 "$overlay/tls.key"
"$overlay/set-ca-bundle.sh" "$work/transition.pem" >/dev/null

say "replacing Secret $NAMESPACE/$SECRET"
k -n "$NAMESPACE" create secret generic "$SECRET" --type=kubernetes.io/tls \
  --from-file=tls.crt="$overlay/tls.crt" \
  --from-file=tls.key="$overlay/tls.key" \
  --from-file=ca.crt="$overlay/ca.crt" \
  --dry-run=client -o yaml |
  k label --local -f - -o yaml \
    app.kubernetes.io/name=gpu-deploy-guard app.kubernetes.io/part-of=gpu-deploy-guard |
  k apply -f - >/dev/null
note "the kubelet updates the mounted files within a minute or two"

finish_rotation
