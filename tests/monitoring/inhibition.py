#!/usr/bin/env python3
"""Runs deploy/monitoring/alertmanager.yaml in a local Alertmanager and checks
its inhibition: which alerts it holds back, and which it must not.

    inhibition.py ALERTMANAGER-BINARY CONFIG

amtool has no offline test for inhibit_rules, so this starts the real
Alertmanager (from the same Debian package as amtool) on a free loopback
port without clustering, posts alerts through its v2 API and reads back each
alert's state. Prints one line per alert; exits 1 on any mismatch.
"""

import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

TELEMETRY = {"component": "gpu-telemetry", "team": "gpu-platform"}

# (labels, expected state)
CASES = [
    # lab-node-2 runs the device plugin without the toolkit: its telemetry and
    # health alerts are held back, the guard's own alert is not.
    ({"alertname": "GpuDeployGuardDevicePluginWithoutToolkit", "severity": "critical", "node": "lab-node-2"}, "active"),
    ({"alertname": "GpuTelemetryDcgmExporterDown", "severity": "warning", "node": "lab-node-2", **TELEMETRY}, "suppressed"),
    ({"alertname": "GpuHealthXidCritical", "severity": "critical", "node": "lab-node-2", "gpu": "0", "xid": "79", **TELEMETRY}, "suppressed"),
    # The same alerts on another node are not.
    ({"alertname": "GpuHealthXidCritical", "severity": "critical", "node": "lab-node-1", "gpu": "0", "xid": "79", **TELEMETRY}, "active"),
    # dcgm-exporter missing on gpu-node-3: its sentinel alert is held back.
    ({"alertname": "GpuDeployGuardOperandMissing", "severity": "warning", "node": "gpu-node-3", "operand": "dcgm-exporter"}, "active"),
    ({"alertname": "GpuTelemetryBlankSentinel", "severity": "warning", "node": "gpu-node-3", "family": "utilisation", "sentinel": "DCGM_INT64_*", **TELEMETRY}, "suppressed"),
    # GPU feature discovery missing does not break telemetry: nothing held back.
    ({"alertname": "GpuDeployGuardOperandMissing", "severity": "warning", "node": "gpu-node-4", "operand": "gpu-feature-discovery"}, "active"),
    ({"alertname": "GpuHealthXidError", "severity": "warning", "node": "gpu-node-4", "gpu": "1", "xid": "62", **TELEMETRY}, "active"),
    # Fleet-wide alerts have no node to match.
    ({"alertname": "GpuTelemetryDcgmExporterTargetsMissing", "severity": "warning", **TELEMETRY}, "active"),
    # A non-telemetry alert on a broken node is not held back.
    ({"alertname": "KubeNodeNotReady", "severity": "warning", "node": "lab-node-2"}, "active"),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(base, path, body=None):
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        text = r.read()
        return json.loads(text) if text.strip().startswith((b"[", b"{")) else text


def main():
    binary, config = sys.argv[1], sys.argv[2]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as storage:
        proc = subprocess.Popen(
            [binary, f"--config.file={config}", f"--storage.path={storage}",
             f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for _ in range(100):
                try:
                    call(base, "/-/ready")
                    break
                except OSError:
                    if proc.poll() is not None:
                        sys.exit("alertmanager exited:\n" + proc.stdout.read().decode())
                    time.sleep(0.1)
            else:
                sys.exit("alertmanager did not become ready")
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 60))
            call(base, "/api/v2/alerts", [{"labels": labels, "startsAt": now} for labels, _ in CASES])
            # Inhibition is decided when the API reads an alert's status.
            failed = 0
            for attempt in range(50):
                got = {}
                for a in call(base, "/api/v2/alerts"):
                    got[json.dumps(a["labels"], sort_keys=True)] = a["status"]["state"]
                results = [(labels, want, got.get(json.dumps(labels, sort_keys=True))) for labels, want in CASES]
                if all(want == state for _, want, state in results):
                    break
                time.sleep(0.2)
            for labels, want, state in results:
                ok = want == state
                failed += not ok
                where = labels.get("node", "(no node)")
                print(f"{'ok  ' if ok else 'FAIL'} {labels['alertname']} {where}: {state}, want {want}")
            return 1 if failed else 0
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
