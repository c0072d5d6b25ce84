#!/usr/bin/env python3
"""Checks .krew.yaml as krew-release-bot will render it for a tag: valid
YAML, a krew Plugin named gpu-deploy-guard, linux amd64 and arm64, each with
a release archive URL for that tag and architecture, and
kubectl-gpu_deploy_guard as the binary (the name that selects the plugin)."""
import re
import sys

import yaml

tag = "v0.1.0"
text = open(sys.argv[1]).read()


def add_uri_and_sha(m):
    url = m.group(1).replace("{{ .TagName }}", tag)
    return f"uri: {url}\n      sha256: {'0' * 64}"


text = re.sub(r'\{\{ addURIAndSha "([^"]+)" \.TagName \}\}', add_uri_and_sha, text)
text = text.replace("{{ .TagName }}", tag)
if "{{" in text:
    sys.exit(f"unrendered template left: {text[text.index('{{'):][:80]!r}")
p = yaml.safe_load(text)
assert p["apiVersion"] == "krew.googlecontainertools.github.com/v1alpha2" and p["kind"] == "Plugin", p
assert p["metadata"]["name"] == "gpu-deploy-guard" and p["spec"]["version"] == tag
arches = []
for pl in p["spec"]["platforms"]:
    sel = pl["selector"]["matchLabels"]
    arches.append(sel["arch"])
    assert sel["os"] == "linux", sel
    assert pl["bin"] == "kubectl-gpu_deploy_guard", pl
    assert pl["uri"].endswith(f"/{tag}/kubectl-gpu_deploy_guard-{tag}-linux-{sel['arch']}.tar.gz"), pl["uri"]
    assert {"from": "kubectl-gpu_deploy_guard", "to": "."} in pl["files"], pl["files"]
assert sorted(arches) == ["amd64", "arm64"], arches
print("krew manifest renders for", tag, "with", ", ".join(sorted(arches)))
