#!/usr/bin/env python3
"""Checks that values reach the objects they are documented to change.

    values_check.py DIR

DIR holds `helm template` output per value set of tests/helm/run.sh
(<name>.yaml). Prints each failed expectation; exits 1 if any.
"""

import base64
import pathlib
import sys

import yaml

problems = []


def load(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def one(objs, kind, suffix=""):
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].endswith(suffix)]
    if len(found) != 1:
        problems.append(f"want one {kind} *{suffix}, found {len(found)}")
        return {}
    return found[0]


def expect(what, got, want):
    if got != want:
        problems.append(f"{what}: {got!r}, want {want!r}")


def kinds(objs):
    return sorted({o["kind"] for o in objs})


def container(objs):
    return one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]


d = sys.argv[1]
sets = {n: load(f"{d}/{n}.yaml") for n in [
    "defaults", "audit", "warn", "cert-manager", "cert-manager-clusterissuer", "existing-secret",
    "everything", "host-network", "gke-private", "gpu-telemetry", "gpu-telemetry-tuned",
    "gpu-telemetry-health-only", "gpu-telemetry-no-groups", "openreports", "no-events", "events-window"]}

# enforcement -> failurePolicy of the enforce webhook and mode in the config.
for name, policy, mode in [("defaults", "Fail", "enforce"), ("warn", "Ignore", "warn"), ("audit", "Ignore", "audit")]:
    vwc = one(sets[name], "ValidatingWebhookConfiguration")
    expect(f"{name}: enforce webhook failurePolicy", vwc["webhooks"][0]["failurePolicy"], policy)
    expect(f"{name}: observe webhook failurePolicy", vwc["webhooks"][1]["failurePolicy"], "Ignore")
    cfg = yaml.safe_load(one(sets[name], "ConfigMap", "-config")["data"]["config.yaml"])
    expect(f"{name}: config mode", cfg["mode"], mode)

# Defaults: self-signed Secret whose CA is the caBundle and whose certificate names the Service.
objs = sets["defaults"]
secret = one(objs, "Secret")
vwc = one(objs, "ValidatingWebhookConfiguration")
expect("defaults: caBundle is the Secret's ca.crt", vwc["webhooks"][0]["clientConfig"].get("caBundle"), secret["data"]["ca.crt"])
expect("defaults: nodes/status matched", vwc["webhooks"][0]["rules"][0]["resources"], ["nodes", "nodes/status"])
expect("defaults: nodeSelector", one(objs, "Deployment")["spec"]["template"]["spec"]["nodeSelector"], {"kubernetes.io/os": "linux"})
expect("defaults: webhook Service ports", [p["name"] for p in one(objs, "Service", "gpu-deploy-guard")["spec"]["ports"]], ["webhook"])
expect("defaults: metrics Service ports", [p["name"] for p in one(objs, "Service", "-metrics")["spec"]["ports"]], ["metrics"])
expect("defaults: admin port bound to the pod IP only", [a for a in container(objs)["args"] if a.startswith("--admin-listen")],
       ["--admin-listen=$(POD_IP):8080"])
expect("defaults: POD_IP from the downward API", [e.get("valueFrom") for e in container(objs)["env"] if e["name"] == "POD_IP"],
       [{"fieldRef": {"fieldPath": "status.podIP"}}])
expect("defaults: no subPath", [m.get("subPath") for m in container(objs)["volumeMounts"]], [None, None])
expect("defaults: kinds", kinds(objs), ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "NetworkPolicy",
                                        "PodDisruptionBudget", "PriorityClass", "Role", "RoleBinding", "Secret", "Service",
                                        "ServiceAccount", "ValidatingWebhookConfiguration"])
# The Role reads the operator's Deployment (its version) beside the DaemonSets and Pods; the
# config names no version, so the Deployment's image tag decides.
expect("defaults: Role resources", sorted(r for rule in one(objs, "Role", "deploy-guard")["rules"] for r in rule["resources"]),
       ["daemonsets", "deployments", "pods"])
# The audit's Lease: create any (the API cannot name an object before it exists), and
# read or renew only the one serve --audit-lease names.
lease_role = one(objs, "Role", "-audit-lease")
expect("defaults: audit Lease Role rules", lease_role.get("rules"),
       [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["gpu-deploy-guard-audit"],
         "verbs": ["get", "update", "patch"]}])
expect("defaults: --audit-lease names the Lease the Role grants",
       [a for a in container(objs)["args"] if a.startswith("--audit-lease")], ["--audit-lease=gpu-deploy-guard-audit"])
expect("defaults: POD_NAME and POD_NAMESPACE from the downward API",
       [e.get("valueFrom") for e in container(objs)["env"] if e["name"] in ("POD_NAME", "POD_NAMESPACE")],
       [{"fieldRef": {"fieldPath": "metadata.name"}}, {"fieldRef": {"fieldPath": "metadata.namespace"}}])
expect("defaults: config operatorVersion",
       "operatorVersion" in yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"]), False)

# cert-manager: own CA Issuer chain, or the given ClusterIssuer and nothing else.
objs = sets["cert-manager"]
expect("cert-manager: kinds", kinds(objs).count("Issuer") + kinds(objs).count("Certificate"), 2)
expect("cert-manager: inject-ca-from", one(objs, "ValidatingWebhookConfiguration")["metadata"]["annotations"],
       {"cert-manager.io/inject-ca-from": "gpu-deploy-guard/gpu-deploy-guard-tls"})
objs = sets["cert-manager-clusterissuer"]
expect("cert-manager-clusterissuer: no Issuer", "Issuer" in kinds(objs), False)
expect("cert-manager-clusterissuer: issuerRef", one(objs, "Certificate")["spec"]["issuerRef"],
       {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "corp-ca"})

# existingSecret: no Secret rendered, the named one mounted, the given caBundle.
objs = sets["existing-secret"]
expect("existing-secret: no Secret", "Secret" in kinds(objs), False)
tls = [v for v in one(objs, "Deployment")["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
expect("existing-secret: mounted Secret", tls["secret"]["secretName"], "my-tls")
expect("existing-secret: caBundle", base64.b64decode(one(objs, "ValidatingWebhookConfiguration")["webhooks"][1]["clientConfig"]["caBundle"]),
       b"not a real CA")

# everything: monitoring labels and places, CEL param, report, digest, NetworkPolicy, tolerations,
# operatorVersion.
objs = sets["everything"]
# The guard's own ServiceMonitor and PrometheusRule (the GPU telemetry ones are checked below).
guard = [o for o in objs if o["metadata"]["name"] == "gpu-deploy-guard"]
for kind in ("ServiceMonitor", "PrometheusRule"):
    expect(f"everything: {kind} release label", one(guard, kind)["metadata"]["labels"].get("release"), "kube-prometheus-stack")
dash = one(objs, "ConfigMap", "-dashboard")
expect("everything: dashboard namespace", dash["metadata"]["namespace"], "grafana")
expect("everything: dashboard label", dash["metadata"]["labels"].get("grafana_dashboard"), "1")
expect("everything: dashboard annotations", dash["metadata"].get("annotations"), {"grafana_folder": "GPU"})
expect("everything: ServiceMonitor port", one(guard, "ServiceMonitor")["spec"]["endpoints"][0]["port"], "metrics")
expect("everything: paramKind", one(objs, "ValidatingAdmissionPolicy", "-device-plugin-needs-toolkit")["spec"].get("paramKind"),
       {"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy"})
# The ClusterPolicy policy reads the request alone: no parameter.
expect("everything: the ClusterPolicy toolkit policy has no paramKind",
       one(objs, "ValidatingAdmissionPolicy", "-cluster-policy-keeps-toolkit")["spec"].get("paramKind"), None)
expect("everything: the ClusterPolicy toolkit policy matches ClusterPolicy UPDATE",
       one(objs, "ValidatingAdmissionPolicy", "-cluster-policy-keeps-toolkit")["spec"]["matchConstraints"]["resourceRules"],
       [{"apiGroups": ["nvidia.com"], "apiVersions": ["*"], "operations": ["UPDATE"], "resources": ["clusterpolicies"]}])
expect("everything: --report", "--report" in container(objs)["args"], True)
expect("everything: config operatorVersion",
       yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"]).get("operatorVersion"), "v25.3.4")
expect("everything: image digest", container(objs)["image"],
       "ghcr.io/gpu-deploy-guard/gpu-deploy-guard@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef")
np = one(objs, "NetworkPolicy")["spec"]["ingress"]
expect("everything: webhook port from the API server only", np[0].get("from"), [{"ipBlock": {"cidr": "10.0.0.0/16"}}])
expect("everything: metrics port from the metrics namespace's prometheus", np[1]["from"],
       [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
         "podSelector": {"matchLabels": {"app": "prometheus"}}}])
expect("everything: no PriorityClass object", "PriorityClass" in kinds(objs), False)
expect("everything: priorityClassName", one(objs, "Deployment")["spec"]["template"]["spec"]["priorityClassName"], "system-cluster-critical")
expect("everything: tolerations", one(objs, "Deployment")["spec"]["template"]["spec"]["tolerations"], [{"operator": "Exists"}])
expect("everything: Namespace restricted", one(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted")
cfg = yaml.safe_load(one(objs, "ConfigMap", "-config")["data"]["config.yaml"])
expect("everything: exempt usernames", cfg["exemptions"]["usernames"], ["alice"])

# hostNetwork: node ports, privileged namespace, no NetworkPolicy, no PDB, no watch, nodes only.
objs = sets["host-network"]
spec = one(objs, "Deployment")["spec"]["template"]["spec"]
expect("host-network: hostNetwork", (spec.get("hostNetwork"), spec.get("dnsPolicy")), (True, "ClusterFirstWithHostNet"))
expect("host-network: ports", [p["containerPort"] for p in container(objs)["ports"]], [9443, 9444])
expect("host-network: listen args", [a for a in container(objs)["args"] if a.startswith("--listen") or a.startswith("--admin-listen")],
       ["--listen=0.0.0.0:9443", "--admin-listen=0.0.0.0:9444"])
expect("host-network: --no-cluster-watch", "--no-cluster-watch" in container(objs)["args"], True)
expect("host-network: Namespace privileged", one(objs, "Namespace")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged")
expect("host-network: no NetworkPolicy, no PDB", [k for k in kinds(objs) if k in ("NetworkPolicy", "PodDisruptionBudget")], [])
expect("host-network: nodes only", one(objs, "ValidatingWebhookConfiguration")["webhooks"][0]["rules"][0]["resources"], ["nodes"])

# GKE private clusters: the webhook on 10250 behind Service port 443.
objs = sets["gke-private"]
expect("gke-private: container port", container(objs)["ports"][0]["containerPort"], 10250)
expect("gke-private: service port", one(objs, "Service", "gpu-deploy-guard")["spec"]["ports"][0]["port"], 443)

# GPU telemetry: with default values the chart's PrometheusRule is the plain rule file, the
# dcgm-exporter ServiceMonitor sets job and node, the Alertmanager Secret carries the example.
MON = pathlib.Path(__file__).resolve().parents[2] / "deploy" / "monitoring"
plain_rules = yaml.safe_load((MON / "rules" / "gpu-telemetry.rules.yaml").read_text())
objs = sets["gpu-telemetry"]
expect("gpu-telemetry: PrometheusRule spec is the plain rule file", one(objs, "PrometheusRule", "-gpu-telemetry").get("spec"), plain_rules)
sm = one(objs, "ServiceMonitor", "-dcgm-exporter")
expect("gpu-telemetry: dcgm-exporter ServiceMonitor namespace", sm["metadata"]["namespace"], "gpu-operator")
expect("gpu-telemetry: dcgm-exporter ServiceMonitor relabelings", sm["spec"]["endpoints"][0]["relabelings"],
       [{"action": "replace", "targetLabel": "job", "replacement": "nvidia-dcgm-exporter"},
        {"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}])
am = one(objs, "Secret", "-alertmanager")
expect("gpu-telemetry: Alertmanager Secret carries alertmanager.yaml",
       am.get("stringData", {}).get("alertmanager.yaml"), (MON / "alertmanager.yaml").read_text())
expect("gpu-telemetry: Alertmanager Secret namespace", am["metadata"]["namespace"], "gpu-deploy-guard")

# Tuned: job, team, switches, thresholds and places reach the objects.
objs = sets["gpu-telemetry-tuned"]
spec = one(objs, "PrometheusRule", "-gpu-telemetry").get("spec", {"groups": []})
expect("gpu-telemetry-tuned: groups", [g["name"] for g in spec["groups"]], ["gpu-telemetry-sentinels", "gpu-health"])
rules = {r.get("alert") or r.get("record") + str(i): r for g in spec["groups"] for i, r in enumerate(g["rules"])}
exprs = "\n".join(r["expr"] for r in rules.values())
texts = " ".join(str(v) for r in rules.values() for v in r.get("annotations", {}).values())
expect("gpu-telemetry-tuned: job nvidia-dcgm-exporter left", "nvidia-dcgm-exporter" in exprs + texts, False)
expect("gpu-telemetry-tuned: selectors of job dcgm", exprs.count('job="dcgm"') >= 20, True)
expect("gpu-telemetry-tuned: team labels", sorted({r["labels"]["team"] for r in rules.values() if "alert" in r}), ["gpu-infra"])
expect("gpu-telemetry-tuned: marker comments kept", exprs.count("# chart: health."), 10)
for alert, parts in [
    ("GpuHealthXidCritical", ['{xid=~"48|79"}']),
    ("GpuHealthXidError", ['{xid=~"48|79"}', '{xid=~"13"}']),
    ("GpuHealthEccDoubleBitErrors", ["> 2 # chart"]),
    ("GpuHealthRetiredPagesPending", ["> 3 # chart"]),
    ("GpuHealthThermalThrottling", ["* 1e-06 # chart", "> 0.25 # chart"]),
    ("GpuHealthPowerThrottling", ["* 1e-06 # chart", "> 0.75 # chart"]),
    ("GpuHealthNvlinkCrcErrors", ["> 1000 # chart"]),
]:
    expr = rules.get(alert, {}).get("expr", "")
    for part in parts:
        expect(f"gpu-telemetry-tuned: {alert} has {part}", part in expr, True)
expect("gpu-telemetry-tuned: ServiceMonitor namespace", one(objs, "ServiceMonitor", "-dcgm-exporter")["metadata"]["namespace"], "monitoring")
expect("gpu-telemetry-tuned: ServiceMonitor job", one(objs, "ServiceMonitor", "-dcgm-exporter")["spec"]["endpoints"][0]["relabelings"][0]["replacement"], "dcgm")
am = [o for o in objs if o["kind"] == "Secret" and o["metadata"]["name"] == "alertmanager-main"]
expect("gpu-telemetry-tuned: Alertmanager Secret name and namespace", [o["metadata"]["namespace"] for o in am], ["monitoring"])

objs = sets["gpu-telemetry-health-only"]
expect("gpu-telemetry-health-only: groups", [g["name"] for g in one(objs, "PrometheusRule", "-gpu-telemetry").get("spec", {"groups": []})["groups"]], ["gpu-health"])
expect("gpu-telemetry-no-groups: no PrometheusRule",
       [o["metadata"]["name"] for o in sets["gpu-telemetry-no-groups"] if o["kind"] == "PrometheusRule"], [])
objs = sets["everything"]
sm = one(objs, "ServiceMonitor", "-dcgm-exporter")
expect("everything: dcgm-exporter ServiceMonitor in operatorNamespace", (sm["metadata"]["namespace"], sm["spec"]["namespaceSelector"]["matchNames"]),
       ("nvidia-gpu-operator", ["nvidia-gpu-operator"]))

# reportFormat: the flag, and RBAC for exactly that report's resource.
def report_rules(objs):
    return [(r["apiGroups"], r["resources"]) for r in one(objs, "ClusterRole")["rules"]
            if r["apiGroups"] not in ([""], ["nvidia.com"], ["resource.k8s.io"], ["apps"])]


# The DRA driver's ResourceSlices are read, never written, whatever the report format.
for name in ("defaults", "openreports"):
    expect(f"{name}: ClusterRole resourceslices",
           [(r["resources"], r["verbs"]) for r in one(sets[name], "ClusterRole")["rules"]
            if r["apiGroups"] == ["resource.k8s.io"]],
           [(["resourceslices"], ["list", "watch"])])
    expect(f"{name}: ClusterRole daemonsets",
           [(r["resources"], r["verbs"]) for r in one(sets[name], "ClusterRole")["rules"]
            if r["apiGroups"] == ["apps"]],
           [(["daemonsets"], ["list", "watch"])])


objs = sets["openreports"]
expect("openreports: args", [a for a in container(objs)["args"] if a.startswith("--report")],
       ["--report", "--report-format=openreports"])
expect("openreports: ClusterRole", report_rules(objs), [(["openreports.io"], ["clusterreports"])])
expect("defaults: ClusterRole", report_rules(sets["defaults"]), [(["wgpolicyk8s.io"], ["clusterpolicyreports"])])


# events: --event-window from events.rateLimit, and a Role in namespace default granting
# exactly create on events.k8s.io events, bound to the guard's service account; with
# events.enabled=false (or no cluster watch) --no-events and no such Role.
def event_args(objs):
    return [a for a in container(objs)["args"] if a.startswith("--event") or a == "--no-events"]


def events_rbac(objs):
    return [o for o in objs if o["kind"] in ("Role", "RoleBinding") and o["metadata"]["name"].endswith("-events")]


objs = sets["defaults"]
expect("defaults: event args", event_args(objs), ["--event-window=10m"])
expect("defaults: events Role", [(o["metadata"]["namespace"], o.get("rules")) for o in events_rbac(objs) if o["kind"] == "Role"],
       [("default", [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create"]}])])
binding = [o for o in events_rbac(objs) if o["kind"] == "RoleBinding"]
expect("defaults: events RoleBinding", [(b["metadata"]["namespace"], b["roleRef"]["name"], b["subjects"]) for b in binding],
       [("default", "gpu-deploy-guard-events",
         [{"kind": "ServiceAccount", "name": "gpu-deploy-guard", "namespace": "gpu-deploy-guard"}])])
# No other rule of the chart names events.
expect("defaults: events granted only by the events Role",
       sorted(o["metadata"]["name"] for o in objs if o["kind"] in ("Role", "ClusterRole")
              for r in o.get("rules", []) if "events" in r.get("resources", [])),
       ["gpu-deploy-guard-events"])
expect("events-window: event args", event_args(sets["events-window"]), ["--event-window=1h"])
for name in ("no-events", "host-network"):
    expect(f"{name}: event args", event_args(sets[name]), ["--no-events"])
    expect(f"{name}: no events Role or RoleBinding", events_rbac(sets[name]), [])

for p in problems:
    print(p)
print(f"{len(problems)} unmet expectations")
sys.exit(1 if problems else 0)
