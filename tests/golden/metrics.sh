#!/usr/bin/env bash
# Sends every review fixture to `serve` and prints each response body (its JSON with sorted
# keys: the order of `auditAnnotations` is not part of the answer) and the /metrics scrape, with
# the figures that depend on the clock (durations, timestamps) left out and each family's series
# sorted (prometheus-client keeps them in a HashMap), so two binaries can be compared byte for
# byte:
#
#   tests/golden/metrics.sh BIN > out.txt
#
# Runs `serve --no-cluster-watch` on free local ports with a self-signed certificate.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:?usage: metrics.sh BIN}
dir=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
listen=$(port)
admin=$(port)
"$bin" serve --no-cluster-watch --write-ca "$dir/ca.crt" --listen "127.0.0.1:$listen" \
    --admin-listen "127.0.0.1:$admin" >"$dir/log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
done
for f in tests/fixtures/reviews/*.json; do
    echo "### $f"
    curl -s --cacert "$dir/ca.crt" -H 'Content-Type: application/json' -w '\n%{http_code}\n' \
        --data-binary @"$f" "https://localhost:$listen/validate" |
        python3 -c 'import json, sys
body, status = sys.stdin.read().rsplit("\n", 2)[:2]
print(json.dumps(json.loads(body), sort_keys=True, indent=1))
print("status", status)'

done
echo "### /metrics"
curl -s "http://127.0.0.1:$admin/metrics" |
    grep -vE '_seconds_(bucket|sum)|_timestamp_seconds |_created ' |
    grep -vE '^gpu_deploy_guard_(process|build)_' |
    python3 -c 'import sys
block = []
for line in sys.stdin:
    if line.startswith("#"):
        sys.stdout.writelines(sorted(block))
        block = []
        sys.stdout.write(line)
    else:
        block.append(line)
sys.stdout.writelines(sorted(block))'
