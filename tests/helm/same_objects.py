#!/usr/bin/env python3
"""Comparisons of rendered manifests.

    same_objects.py A.yaml B.yaml
        Both files hold the same objects (by apiVersion, kind, namespace and
        name) with equal content; prints the first differences.

    same_objects.py --operator-namespace NS RENDERED.yaml
        The chart rendered with operatorNamespace=NS names NS in every place
        that names the GPU Operator's namespace, and the default
        "gpu-operator" nowhere (the dashboard's search tags aside).
"""

import re
import sys

import yaml


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    out = {}
    for d in docs:
        m = d.get("metadata", {})
        key = (d.get("apiVersion"), d.get("kind"), m.get("namespace", ""), m.get("name"))
        if key in out:
            raise SystemExit(f"{path}: {key} twice")
        out[key] = d
    return out


def diff(a, b, path=""):
    if type(a) is not type(b):
        return [f"{path}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}/{k}: only in {'second' if k not in a else 'first'}")
            else:
                out += diff(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)} items"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += diff(x, y, f"{path}/{i}")
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def same(a_path, b_path):
    a, b = load(a_path), load(b_path)
    problems = [f"only in {a_path}: {k}" for k in a if k not in b]
    problems += [f"only in {b_path}: {k}" for k in b if k not in a]
    for k in a:
        if k in b:
            problems += [f"{k}: {d}" for d in diff(a[k], b[k])]
    for p in problems[:40]:
        print(p)
    return 1 if problems else 0


def strings(node):
    if isinstance(node, dict):
        for k, v in node.items():
            yield k
            yield from strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from strings(v)
    elif isinstance(node, str):
        yield node


def operator_namespace(ns, path):
    objs = load(path)
    default = re.compile(r"(?<![\w.-])gpu-operator(?![\w-])")
    problems = []
    for key, obj in objs.items():
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"].endswith("-dashboard"):
            continue
        for s in strings(obj):
            if default.search(s):
                problems.append(f"{key}: still names gpu-operator: {s[:160]!r}")

    def find(kind, name_suffix=""):
        found = [o for (_, k, _, n), o in objs.items() if k == kind and n.endswith(name_suffix)]
        if len(found) != 1:
            problems.append(f"want one {kind} *{name_suffix}, found {len(found)}")
            return {}
        return found[0]

    prefix = f"system:serviceaccount:{ns}:"
    vwc = find("ValidatingWebhookConfiguration")
    for w in vwc.get("webhooks", []):
        exprs = " ".join(c["expression"] for c in w.get("matchConditions", []))
        if prefix not in exprs:
            problems.append(f"webhook {w['name']}: matchConditions do not name {prefix}")
    for kind in ("Role", "RoleBinding"):
        if find(kind, "deploy-guard").get("metadata", {}).get("namespace") != ns:
            problems.append(f"{kind} is not in {ns}")
        # The audit's Lease stays in the release namespace, whatever operatorNamespace says.
        if find(kind, "-audit-lease").get("metadata", {}).get("namespace") == ns:
            problems.append(f"{kind} *-audit-lease moved to {ns}")
    config = yaml.safe_load(find("ConfigMap", "-config").get("data", {}).get("config.yaml", "{}"))
    if config.get("operatorNamespace") != ns or ns not in config.get("exemptions", {}).get("serviceAccountNamespaces", []):
        problems.append(f"config.yaml: operatorNamespace/serviceAccountNamespaces do not say {ns}: {config}")
    for suffix in ("-device-plugin-needs-toolkit", "-cluster-policy-keeps-toolkit"):
        vap = find("ValidatingAdmissionPolicy", suffix)
        if prefix not in " ".join(c["expression"] for c in vap.get("spec", {}).get("matchConditions", [])):
            problems.append(f"ValidatingAdmissionPolicy *{suffix} matchConditions do not name {prefix}")
    for suffix in ("gpu-deploy-guard", "-gpu-telemetry"):
        rules = find("PrometheusRule", suffix)
        if f"-n {ns} " not in " ".join(strings(rules)):
            problems.append(f"PrometheusRule *{suffix} runbooks do not say -n {ns}")
    sm = find("ServiceMonitor", "-dcgm-exporter")
    if sm.get("spec", {}).get("namespaceSelector", {}).get("matchNames") != [ns]:
        problems.append(f"the dcgm-exporter ServiceMonitor does not select namespace {ns}")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--operator-namespace":
        sys.exit(operator_namespace(sys.argv[2], sys.argv[3]))
    if len(sys.argv) == 3:
        sys.exit(same(sys.argv[1], sys.argv[2]))
    print(__doc__, file=sys.stderr)
    sys.exit(2)
