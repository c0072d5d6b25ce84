#!/usr/bin/env python3
"""Static checks of deploy/monitoring that promtool does not do.

    check.py metric-names   every metric in the rules and the dashboard is one
                            gpu-deploy-guard or dcgm-exporter exports, one a
                            rule records, or Prometheus' own `up`
    check.py alert-coverage every alert has a test where it fires and one
                            where it stays silent, and no test names an
                            alert that does not exist
    check.py crd            each PrometheusRule's spec is its plain rule file
    check.py configmap      the dashboard ConfigMap carries the JSON file
    check.py dashboard      the dashboard is Grafana JSON as we mean it:
                            schema, templated data source, ids, panels
    check.py telemetry-runbooks  every GPU telemetry alert has a section in
                            docs/troubleshooting.md its runbook links to, a
                            documented severity, and the labels routing and
                            inhibition match on

Each prints one line per problem and exits 1 if there is any.
"""

import json
import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MON = ROOT / "deploy" / "monitoring"
RULES = MON / "rules" / "gpu-deploy-guard.rules.yaml"
CRD = MON / "prometheusrule.yaml"
TELEMETRY_RULES = MON / "rules" / "gpu-telemetry.rules.yaml"
TELEMETRY_CRD = MON / "prometheusrule-gpu-telemetry.yaml"
DASHBOARD = MON / "grafana-dashboard.json"
CONFIGMAP = MON / "grafana-dashboard.yaml"
ALERT_TESTS = Path(__file__).resolve().parent / "alerts_test.yaml"
TELEMETRY_TESTS = Path(__file__).resolve().parent / "gpu_telemetry_test.yaml"
# Each rule file, its generated PrometheusRule and its promtool tests.
RULE_FILES = [(RULES, CRD, ALERT_TESTS), (TELEMETRY_RULES, TELEMETRY_CRD, TELEMETRY_TESTS)]

# What the binary exposes on :8080/metrics (src/metrics.rs and the cluster
# audit), plus the series Prometheus itself writes for every target. A rule
# or panel that names anything else would silently never match.
HISTOGRAM = "gpu_deploy_guard_admission_review_duration_seconds"
KNOWN_METRICS = {
    "gpu_deploy_guard_admission_reviews_total",
    "gpu_deploy_guard_admission_findings_total",
    "gpu_deploy_guard_admission_bad_requests_total",
    HISTOGRAM + "_bucket",
    HISTOGRAM + "_sum",
    HISTOGRAM + "_count",
    "gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds",
    "gpu_deploy_guard_tls_certificate_reloads_total",
    "gpu_deploy_guard_webhook_tls_handshakes_total",
    "gpu_deploy_guard_webhook_connection_timeouts_total",
    "gpu_deploy_guard_webhook_open_connections",
    "gpu_deploy_guard_webhook_max_connections",
    "gpu_deploy_guard_tls_certificate_reload_failures_total",
    "gpu_deploy_guard_tls_client_ca_reloads_total",
    "gpu_deploy_guard_connection_pool_full",
    "gpu_deploy_guard_connection_pool_evictions_total",
    "gpu_deploy_guard_connection_pool_refusals_total",
    "gpu_deploy_guard_connection_pool_top_source_connections",
    "gpu_deploy_guard_source_share_refusals_total",
    "gpu_deploy_guard_source_share_last_refused",
    "gpu_deploy_guard_operator_version_info",
    "gpu_deploy_guard_operand_expected",
    "gpu_deploy_guard_operand_running",
    "gpu_deploy_guard_audit_findings",
    "gpu_deploy_guard_audit_last_run_timestamp_seconds",
    "gpu_deploy_guard_audit_nodes",
    "gpu_deploy_guard_cluster_policy_available",
    # Fleet totals per operand and state (expected, running, missing), from
    # the audit's fleet-scale metrics: the per-node operand series exist only
    # for nodes with a finding or a missing operand.
    "gpu_deploy_guard_operand_nodes",
    "up",
    "ALERTS",
    # kube-state-metrics' reading of node status.allocatable (resource
    # nvidia.com/gpu becomes nvidia_com_gpu), joined with the guard's series.
    "kube_node_status_allocatable",
}

# dcgm-exporter's series: the DCGM fields of its etc/default-counters.csv
# (those commented out there too: a custom counters CSV turns them on) that
# the rules and the dashboard use. `__name__=~"DCGM_FI_..."` selectors count
# as DCGM_FI_*.
DCGM_METRICS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_POWER_VIOLATION", "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_RETIRED_PENDING", "DCGM_FI_DEV_RETIRED_DBE",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_*",
}

PROMQL_KEYWORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring",
    "group_left", "group_right", "bool", "offset", "inf", "nan",
    "atan2", "start", "end",
}


def metric_names(expr):
    """The metric names a PromQL expression selects.

    Not a parser: it blanks out what cannot be a metric name (strings, label
    matchers, ranges, grouping label lists, Grafana variables, numbers), then
    every identifier left that is neither a function call nor a keyword is a
    metric name. Enough for the expressions we write, and it errs towards
    reporting too much, never too little.
    """
    names = set()
    if re.search(r'__name__\s*=~\s*"DCGM_FI_', expr):
        names.add("DCGM_FI_*")
    s = re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)
    s = re.sub(r"#[^\n]*", " ", s)  # PromQL comments (after strings: none holds a #)
    s = re.sub(r"\$\{[^}]*\}|\$\w+", " ", s)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(
        r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s
    )
    s = re.sub(r"\b\d+(\.\d+)?([eE][-+]?\d+)?(ms|s|m|h|d|w|y)?\b", " ", s)
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        word = m.group(0)
        if word.lower() in PROMQL_KEYWORDS:
            continue
        if re.match(r"\s*\(", s[m.end():]):
            continue  # a function or an aggregation
        names.add(word)
    return names


def rule_exprs(path=None):
    for rules in [path] if path else [r for r, _, _ in RULE_FILES]:
        doc = yaml.safe_load(rules.read_text())
        for group in doc["groups"]:
            for rule in group["rules"]:
                yield rule.get("alert") or rule.get("record"), rule["expr"]


def recorded_names():
    names = set()
    for rules, _, _ in RULE_FILES:
        for group in yaml.safe_load(rules.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def dashboard_exprs():
    dash = json.loads(DASHBOARD.read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield f'panel "{panel["title"]}" {target["refId"]}', target["expr"]


def check_metric_names():
    problems = []
    checked = 0
    known = KNOWN_METRICS | DCGM_METRICS | recorded_names()
    for where, expr in list(rule_exprs()) + list(dashboard_exprs()):
        names = metric_names(expr)
        if not names:
            problems.append(f"{where}: no metric name found in {expr!r}")
        for name in sorted(names - known):
            problems.append(f"{where}: unknown metric {name}")
        checked += 1
    return problems, f"{checked} expressions use only known metrics"


def check_alert_coverage():
    problems = []
    total = 0
    for rules, _, tests in RULE_FILES:
        doc = yaml.safe_load(rules.read_text())
        alerts = [r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r]
        total += len(alerts)
        fires, silent = set(), set()
        tdoc = yaml.safe_load(tests.read_text())
        if tdoc.get("rule_files") != [f"../../deploy/monitoring/rules/{rules.name}"]:
            problems.append(f"{tests.name}: rule_files is not [{rules.name}]")
        for group in tdoc["tests"]:
            for case in group.get("alert_rule_test", []):
                name = case["alertname"]
                if name not in alerts:
                    problems.append(f'{tests.name}: test group "{group.get("name")}": no alert named {name}')
                (fires if case.get("exp_alerts") else silent).add(name)
        for name in alerts:
            if name not in fires:
                problems.append(f"{name}: no test in {tests.name} where it fires")
            if name not in silent:
                problems.append(f"{name}: no test in {tests.name} where it stays silent")
    return problems, f"{total} alerts each fire in one test and stay silent in another"


def check_crd():
    problems = []
    for rules, crd_path, _ in RULE_FILES:
        plain = yaml.safe_load(rules.read_text())
        crd = yaml.safe_load(crd_path.read_text())
        if crd.get("apiVersion") != "monitoring.coreos.com/v1" or crd.get("kind") != "PrometheusRule":
            problems.append(f"{crd_path.name}: not a monitoring.coreos.com/v1 PrometheusRule")
        if crd.get("spec") != plain:
            problems.append(f"{crd_path.name}: spec differs from {rules.name}")
    return problems, "each PrometheusRule's spec equals its plain rule file"


def check_configmap():
    cm = yaml.safe_load(CONFIGMAP.read_text())
    problems = []
    if cm.get("kind") != "ConfigMap":
        problems.append(f"{CONFIGMAP.name}: not a ConfigMap")
    if cm.get("metadata", {}).get("labels", {}).get("grafana_dashboard") != "1":
        problems.append(f'{CONFIGMAP.name}: label grafana_dashboard: "1" missing')
    data = cm.get("data", {})
    if list(data) != ["gpu-deploy-guard.json"]:
        problems.append(f"{CONFIGMAP.name}: data keys {list(data)}, want [gpu-deploy-guard.json]")
    elif data["gpu-deploy-guard.json"] != DASHBOARD.read_text():
        problems.append(f"{CONFIGMAP.name}: data differs from {DASHBOARD.name}")
    return problems, "dashboard ConfigMap carries the JSON file"


def check_dashboard():
    dash = json.loads(DASHBOARD.read_text())
    problems = []
    want_ds = {"type": "prometheus", "uid": "${datasource}"}
    if dash.get("schemaVersion", 0) < 36:
        problems.append(f"schemaVersion {dash.get('schemaVersion')} < 36")
    if not dash.get("uid") or not dash.get("title"):
        problems.append("uid and title are required")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("templating: no datasource variable of type prometheus")
    if "dcgm_job" not in variables:
        problems.append("templating: no dcgm_job variable for dcgm-exporter's job label")
    ids = set()
    exprs = []
    rows = []
    for panel in dash.get("panels", []):
        title = panel.get("title", "?")
        if panel.get("id") in ids:
            problems.append(f'panel "{title}": duplicate id {panel.get("id")}')
        ids.add(panel.get("id"))
        gp = panel.get("gridPos", {})
        if not all(k in gp for k in ("x", "y", "w", "h")) or gp.get("x", 0) + gp.get("w", 0) > 24:
            problems.append(f'panel "{title}": bad gridPos {gp}')
        if panel.get("type") == "row":
            rows.append(panel)
            if panel.get("targets") or not panel.get("title"):
                problems.append(f'row "{title}": a row has a title and no query')
            continue
        raw_dcgm = any(re.search(r"\bDCGM_FI_", t.get("expr", "")) for t in panel.get("targets", []))
        if raw_dcgm:
            for value, text in SENTINELS.items():
                got = mapped(panel, value)
                if not got or text not in got:
                    problems.append(f'panel "{title}" plots a raw DCGM field but maps {value:.0f} to {got!r}, not "{text}"')
        if panel.get("datasource") != want_ds:
            problems.append(f'panel "{title}": datasource is not ${{datasource}}')
        if not panel.get("targets"):
            problems.append(f'panel "{title}": no query')
        for target in panel.get("targets", []):
            if target.get("datasource") != want_ds:
                problems.append(f'panel "{title}" {target.get("refId")}: datasource is not ${{datasource}}')
            exprs.append((panel.get("type"), target.get("expr", "")))
    # The views the dashboard exists for.
    wanted = {
        "node x operand grid (table or state-timeline of expected vs running)": lambda t, e: t in ("table", "state-timeline", "status-history")
        and "gpu_deploy_guard_operand_expected" in e and "gpu_deploy_guard_operand_running" in e,
        "decisions per second by decision": lambda t, e: "rate(gpu_deploy_guard_admission_reviews_total" in e and "by (decision)" in e,
        "findings by rule": lambda t, e: "gpu_deploy_guard_admission_findings_total" in e and "rule" in e,
        "review latency p50": lambda t, e: e.startswith("histogram_quantile(0.5,") and HISTOGRAM in e,
        "review latency p99": lambda t, e: e.startswith("histogram_quantile(0.99,") and HISTOGRAM in e,
        "certificate days left": lambda t, e: "gpu_deploy_guard_tls_certificate_expiry_timestamp_seconds" in e and "86400" in e,
        "webhook TLS handshakes per second": lambda t, e: "rate(gpu_deploy_guard_webhook_tls_handshakes_total" in e,
    }
    for what, test in wanted.items():
        if not any(test(t, e) for t, e in exprs):
            problems.append(f"no panel shows {what}")
    # The GPU health row sits right below the node x operand grid and its timeline.
    panels = dash.get("panels", [])
    gpu_rows = [r for r in rows if "GPU health" in r.get("title", "")]
    grid = [p for p in panels if p.get("type") != "row" and any(
        "gpu_deploy_guard_operand_expected" in t.get("expr", "") for t in p.get("targets", []))]
    if len(gpu_rows) != 1:
        problems.append(f"want one GPU health row, found {len(gpu_rows)}")
    elif grid:
        bottom = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in grid)
        if gpu_rows[0]["gridPos"]["y"] != bottom:
            problems.append(f"GPU health row at y={gpu_rows[0]['gridPos']['y']}, not right below the operand grid (y={bottom})")
        below = [p for p in panels if p["gridPos"]["y"] > gpu_rows[0]["gridPos"]["y"]]
        gpu = [p for p in below if any(re.search(r"DCGM_FI_|dcgm|gpu-telemetry", t.get("expr", ""))
                                       for t in p.get("targets", []))]
        others = [p for p in below if p not in gpu]
        if len(gpu) < 4:
            problems.append(f"the GPU health row holds {len(gpu)} GPU telemetry panels, want at least 4")
        elif others and max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in gpu) > min(p["gridPos"]["y"] for p in others):
            problems.append("GPU telemetry panels are not all above the guard's panels that follow the GPU health row")
    return problems, f"dashboard: {len(ids)} panels, schemaVersion {dash.get('schemaVersion')}, data source templated"


# DCGM's blank sentinels as Prometheus stores them, and the word a panel
# must show for each instead of the number.
SENTINELS = {
    2.0 ** 63: "not supported",
    2147483632.0: "blank", 2147483633.0: "not found", 2147483634.0: "not supported", 2147483635.0: "not permissioned",
    2.0 ** 47: "blank", 2.0 ** 47 + 1: "not found", 2.0 ** 47 + 2: "not supported", 2.0 ** 47 + 3: "not permissioned",
}


def mapped(panel, value):
    """The text a panel's value mappings give value, as Grafana matches them:
    value mappings compare JavaScript's string of the number, ranges compare
    numbers."""
    js = str(int(value)) if value < 2 ** 53 else None  # JavaScript prints 2^63 as 9223372036854776000
    for m in panel.get("fieldConfig", {}).get("defaults", {}).get("mappings", []):
        opts = m.get("options", {})
        if m.get("type") == "value" and js in opts:
            return opts[js].get("text")
        if m.get("type") == "range" and opts.get("from", float("inf")) <= value <= opts.get("to", float("-inf")):
            return opts.get("result", {}).get("text")
    return None


def check_telemetry_runbooks():
    docs = (ROOT / "docs" / "troubleshooting.md").read_text()
    headings = set(re.findall(r"^### (\S+)$", docs, re.M))
    problems = []
    doc = yaml.safe_load(TELEMETRY_RULES.read_text())
    alerts = [r for g in doc["groups"] for r in g["rules"] if "alert" in r]
    for r in alerts:
        name = r["alert"]
        if name not in headings:
            problems.append(f"{name}: no '### {name}' section in docs/troubleshooting.md")
        if f"docs/troubleshooting.md#{name.lower()}" not in r.get("annotations", {}).get("runbook", ""):
            problems.append(f"{name}: runbook does not link to docs/troubleshooting.md#{name.lower()}")
        labels = r.get("labels", {})
        if labels.get("severity") not in ("critical", "warning", "info"):
            problems.append(f"{name}: severity {labels.get('severity')!r} is not critical, warning or info")
        if labels.get("component") != "gpu-telemetry" or labels.get("team") != "gpu-platform":
            problems.append(f"{name}: needs component=gpu-telemetry and team=gpu-platform (routing and inhibition match on them)")
    return problems, f"{len(alerts)} GPU telemetry alerts have runbooks, severities and routing labels"


CHECKS = {
    "metric-names": check_metric_names,
    "alert-coverage": check_alert_coverage,
    "crd": check_crd,
    "configmap": check_configmap,
    "dashboard": check_dashboard,
    "telemetry-runbooks": check_telemetry_runbooks,
}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CHECKS:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(CHECKS)}}}")
    problems, summary = CHECKS[sys.argv[1]]()
    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(summary)
