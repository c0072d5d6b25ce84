#!/usr/bin/env python3
"""Validate rendered manifests offline.

    validate.py --k8s 1.34.0 --crd CRD.yaml... -- MANIFEST.yaml...

Built-in kinds are checked strictly (unknown fields are errors) against the
Kubernetes OpenAPI schemas bundled in kubernetes-validate. Kinds defined by a
--crd file (cert-manager, prometheus-operator, wgpolicyk8s) are checked
against that CRD's openAPIV3Schema for the object's version, also strictly: a
field the schema does not declare is an error unless the schema preserves
unknown fields there. A kind with no schema at all is an error, never a pass.

RBAC rules and ValidatingAdmissionPolicy paramKinds that name a group served
by a --crd file must name a resource/kind that CRD defines.

Prints one line per object and exits 1 on any failure.
"""

import argparse
import copy
import sys

import jsonschema
import kubernetes_validate
import yaml


def load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def strict(schema):
    """A copy of schema in which objects with declared properties reject others."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    return schema


class CRDs:
    def __init__(self, files):
        self.schemas = {}  # (group/version, kind) -> schema
        self.resources = {}  # group -> set of plural names
        self.kinds = {}  # group -> {version: set of kinds}
        for path in files:
            for crd in load_docs(path):
                if crd.get("kind") != "CustomResourceDefinition":
                    continue
                spec = crd["spec"]
                group, kind = spec["group"], spec["names"]["kind"]
                self.resources.setdefault(group, set()).add(spec["names"]["plural"])
                for v in spec["versions"]:
                    if not v.get("served", True):
                        continue
                    self.kinds.setdefault(group, {}).setdefault(v["name"], set()).add(kind)
                    s = v.get("schema", {}).get("openAPIV3Schema")
                    if s is None:
                        raise SystemExit(f"{path}: {group}/{v['name']} {kind} has no schema")
                    self.schemas[(f"{group}/{v['name']}", kind)] = strict(s)

    def group(self, api_version):
        return api_version.split("/")[0] if "/" in api_version else ""


def check_references(obj, crds):
    """RBAC resources and paramKinds in groups we have CRDs for must exist."""
    errors = []
    if obj["kind"] in ("ClusterRole", "Role"):
        for rule in obj.get("rules", []):
            for group in rule.get("apiGroups", []):
                if group not in crds.resources:
                    continue
                for res in rule.get("resources", []):
                    if res.split("/")[0] not in crds.resources[group]:
                        errors.append(f"rule names {res}.{group}, which the CRDs of {group} do not define "
                                      f"(they define {sorted(crds.resources[group])})")
    if obj["kind"] == "ValidatingAdmissionPolicy":
        pk = obj["spec"].get("paramKind")
        if pk:
            group, _, version = pk["apiVersion"].rpartition("/")
            if group in crds.kinds and pk["kind"] not in crds.kinds[group].get(version, set()):
                errors.append(f"paramKind {pk['apiVersion']} {pk['kind']} is not served by the CRDs of {group}")
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k8s", required=True)
    ap.add_argument("--crd", action="append", default=[])
    ap.add_argument("--require-crd-group", action="append", default=[],
                    help="fail unless the --crd files define this group")
    ap.add_argument("manifests", nargs="+")
    args = ap.parse_args()
    crds = CRDs(args.crd)
    for g in args.require_crd_group:
        if g not in crds.resources:
            raise SystemExit(f"no CRD of group {g} among --crd files")

    failed = checked = 0
    for path in args.manifests:
        for obj in load_docs(path):
            name = f"{path}: {obj.get('kind')} {obj.get('metadata', {}).get('namespace', '')}/{obj.get('metadata', {}).get('name')}"
            errors = []
            key = (obj.get("apiVersion", ""), obj.get("kind", ""))
            group = crds.group(key[0])
            try:
                if key in crds.schemas:
                    v = jsonschema.Draft7Validator(crds.schemas[key])
                    errors += [f"{'/'.join(map(str, e.absolute_path)) or '.'}: {e.message}"
                               for e in sorted(v.iter_errors(obj), key=str)]
                elif group in crds.kinds:
                    errors.append(f"{key[0]} {key[1]} is not served by the CRDs of {group}")
                else:
                    kubernetes_validate.validate(obj, args.k8s, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append(f"{'/'.join(map(str, e.path)) or '.'}: {e.message}")
            except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as e:
                errors.append(f"no schema for {key[0]} {key[1]}: {e}")
            errors += check_references(obj, crds)
            checked += 1
            if errors:
                failed += 1
                print(f"FAIL {name}")
                for e in errors:
                    print(f"     {e}")
            else:
                print(f"ok   {name}")
    print(f"{checked} objects checked, {failed} invalid")
    return 1 if failed or not checked else 0


if __name__ == "__main__":
    sys.exit(main())
