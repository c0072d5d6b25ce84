#!/usr/bin/env python3
"""Writes the benchmark fixtures under benches/fixtures/: a large, realistic GPU Node (about 100
labels, 50 images in status, conditions, addresses, capacity, managedFields) and two
AdmissionReviews of a deploy-label flip on it, as the API server sends them (compact JSON):

  large-node.json               the Node alone (kubectl get node -o json)
  large-node-review-allowed.json  dcgm-exporter true -> false by a cluster admin: allowed, no finding
  large-node-review-denied.json   container-toolkit true -> false with the device plugin on: denied

Deterministic: rerun after changing it and commit the output."""
import copy
import hashlib
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "benches", "fixtures")
NAME = "gpu-h100-worker-017"
P = "nvidia.com/gpu.deploy."


def digest(seed):
    return "sha256:" + hashlib.sha256(seed.encode()).hexdigest()


def labels():
    out = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": "p5.48xlarge",
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": "us-east-1a",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": NAME,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": "p5.48xlarge",
        "node-role.kubernetes.io/gpu-worker": "",
        "node.kubernetes.io/lifecycle": "on-demand",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": "us-east-1a",
        "topology.ebs.csi.aws.com/zone": "us-east-1a",
        "topology.k8s.aws/zone-id": "use1-az4",
        "topology.k8s.aws/network-node-layer-1": "nn-3f8c2a9d0e1b4c5d6",
        "topology.k8s.aws/network-node-layer-2": "nn-7a1b2c3d4e5f60718",
        "topology.k8s.aws/network-node-layer-3": "nn-9e8d7c6b5a4f30211",
        "cluster.example.com/pool": "h100-training",
        "cluster.example.com/team": "foundation-models",
        "cluster.example.com/cost-center": "cc-4471",
    }
    nfd = {
        "cpu-cpuid.ADX": "true", "cpu-cpuid.AESNI": "true", "cpu-cpuid.AVX": "true",
        "cpu-cpuid.AVX2": "true", "cpu-cpuid.AVX512BW": "true", "cpu-cpuid.AVX512CD": "true",
        "cpu-cpuid.AVX512DQ": "true", "cpu-cpuid.AVX512F": "true", "cpu-cpuid.AVX512VL": "true",
        "cpu-cpuid.AVX512VNNI": "true", "cpu-cpuid.FMA3": "true", "cpu-cpuid.SHA": "true",
        "cpu-cpuid.VMX": "true", "cpu-hardware_multithreading": "true",
        "cpu-model.family": "6", "cpu-model.id": "143", "cpu-model.vendor_id": "Intel",
        "cpu-cstate.enabled": "true", "cpu-pstate.status": "active", "cpu-pstate.turbo": "true",
        "kernel-config.NO_HZ": "true", "kernel-config.NO_HZ_IDLE": "true",
        "kernel-version.full": "5.15.0-1051-aws", "kernel-version.major": "5",
        "kernel-version.minor": "15", "kernel-version.revision": "0",
        "memory-numa": "true", "network-sriov.capable": "true",
        "pci-0302_10de.present": "true", "pci-10de.present": "true", "pci-1d0f.present": "true",
        "pci-1d0f.sriov.capable": "true", "storage-nonrotationaldisk": "true",
        "system-os_release.ID": "ubuntu", "system-os_release.VERSION_ID": "22.04",
        "system-os_release.VERSION_ID.major": "22", "system-os_release.VERSION_ID.minor": "04",
    }
    out.update({"feature.node.kubernetes.io/" + k: v for k, v in nfd.items()})
    gfd = {
        "cuda.driver-version.full": "550.90.07", "cuda.driver-version.major": "550",
        "cuda.driver-version.minor": "90", "cuda.driver-version.revision": "07",
        "cuda.driver.major": "550", "cuda.driver.minor": "90", "cuda.driver.rev": "07",
        "cuda.runtime-version.full": "12.4", "cuda.runtime-version.major": "12",
        "cuda.runtime-version.minor": "4", "cuda.runtime.major": "12", "cuda.runtime.minor": "4",
        "gfd.timestamp": "1727701234", "gpu-driver-upgrade-state": "upgrade-done",
        "gpu.compute.major": "9", "gpu.compute.minor": "0", "gpu.count": "8",
        "gpu.family": "hopper", "gpu.machine": "p5.48xlarge", "gpu.memory": "81559",
        "gpu.mode": "compute", "gpu.present": "true", "gpu.product": "NVIDIA-H100-80GB-HBM3",
        "gpu.replicas": "1", "gpu.sharing-strategy": "none", "mig.capable": "true",
        "mig.config": "all-disabled", "mig.config.state": "success", "mig.strategy": "single",
        "mps.capable": "false", "vgpu.present": "false", "gpu.workload.config": "container",
    }
    out.update({"nvidia.com/" + k: v for k, v in gfd.items()})
    for op in ["driver", "container-toolkit", "operator-validator", "device-plugin",
               "gpu-feature-discovery", "dcgm", "dcgm-exporter", "node-status-exporter",
               "mig-manager"]:
        out[P + op] = "true"
    out[P + "nvsm"] = ""
    return out


USER_IMAGES = {"cuda", "pytorch", "tritonserver", "nemo", "tensorrt"}


def images():
    repos = [
        ("nvcr.io/nvidia/cuda", ["12.4.1-base-ubi8", "12.4.1-runtime-ubuntu22.04", "12.2.0-base-ubuntu22.04"]),
        ("nvcr.io/nvidia/driver", ["550.90.07-ubuntu22.04", "550.54.15-ubuntu22.04"]),
        ("nvcr.io/nvidia/k8s/container-toolkit", ["v1.16.2-ubuntu20.04", "v1.15.0-ubuntu20.04"]),
        ("nvcr.io/nvidia/k8s-device-plugin", ["v0.16.2", "v0.15.0"]),
        ("nvcr.io/nvidia/gpu-feature-discovery", ["v0.8.2-ubi8"]),
        ("nvcr.io/nvidia/k8s/dcgm-exporter", ["3.3.7-3.5.0-ubuntu22.04", "3.3.5-3.4.1-ubuntu22.04"]),
        ("nvcr.io/nvidia/cloud-native/dcgm", ["3.3.7-1-ubuntu22.04"]),
        ("nvcr.io/nvidia/cloud-native/gpu-operator-validator", ["v24.6.2", "v24.3.0"]),
        ("nvcr.io/nvidia/cloud-native/k8s-mig-manager", ["v0.8.0-ubuntu20.04"]),
        ("nvcr.io/nvidia/cloud-native/k8s-driver-manager", ["v0.6.10", "v0.6.8"]),
        ("nvcr.io/nvidia/cloud-native/k8s-kata-manager", ["v0.2.1"]),
        ("nvcr.io/nvidia/pytorch", ["24.08-py3", "24.05-py3", "23.12-py3"]),
        ("nvcr.io/nvidia/tritonserver", ["24.08-py3", "24.05-trtllm-python-py3"]),
        ("nvcr.io/nvidia/nemo", ["24.07", "24.05.01"]),
        ("nvcr.io/nvidia/tensorrt", ["24.08-py3"]),
        ("registry.k8s.io/nfd/node-feature-discovery", ["v0.16.4", "v0.15.4"]),
        ("registry.k8s.io/kube-proxy", ["v1.30.4", "v1.29.8"]),
        ("registry.k8s.io/pause", ["3.9", "3.8"]),
        ("registry.k8s.io/coredns/coredns", ["v1.11.1"]),
        ("registry.k8s.io/metrics-server/metrics-server", ["v0.7.1"]),
        ("registry.k8s.io/sig-storage/csi-node-driver-registrar", ["v2.11.1"]),
        ("registry.k8s.io/sig-storage/livenessprobe", ["v2.13.1"]),
        ("public.ecr.aws/ebs-csi-driver/aws-ebs-csi-driver", ["v1.34.0"]),
        ("602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon-k8s-cni", ["v1.18.3-eksbuild.2"]),
        ("602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon-k8s-cni-init", ["v1.18.3-eksbuild.2"]),
        ("602401143452.dkr.ecr.us-east-1.amazonaws.com/amazon/aws-network-policy-agent", ["v1.1.2-eksbuild.2"]),
        ("quay.io/prometheus/node-exporter", ["v1.8.2", "v1.7.0"]),
        ("quay.io/cilium/cilium", ["v1.15.8"]),
        ("docker.io/grafana/promtail", ["3.1.1"]),
        ("docker.io/fluent/fluent-bit", ["3.1.7"]),
        ("ghcr.io/kubeflow/training-operator", ["v1-855e096"]),
        ("ghcr.io/example-org/llm-train", ["2024.09.30-a1b2c3d", "2024.09.16-9f8e7d6", "2024.09.02-5c4b3a2"]),
        ("ghcr.io/example-org/eval-harness", ["v0.4.3"]),
    ]
    out = []
    for repo, tags in repos:
        for tag in tags:
            if len(out) == 50:
                return out
            d = digest(repo + ":" + tag)
            size = int(hashlib.md5((repo + tag).encode()).hexdigest()[:8], 16) % 9_000_000_000 + 700_000
            # The operator's operands and the training job are pinned by digest, and an image pulled by digest has no tag name.
            pinned = (repo.startswith("nvcr.io/nvidia/") and repo.split("/")[-1] not in USER_IMAGES
                      or repo.endswith("/llm-train"))
            names = [f"{repo}@{d}"] if pinned else [f"{repo}@{d}", f"{repo}:{tag}"]
            out.append({"names": names, "sizeBytes": size})
    return out


def node(lbls, resource_version):
    ts = "2024-09-30T12:41:07Z"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NAME,
            "uid": "8f6b3c1e-2d4a-4b7e-9c0f-1a2b3c4d5e6f",
            "resourceVersion": resource_version,
            "creationTimestamp": "2024-08-12T07:03:55Z",
            "labels": lbls,
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": "10.42.17.23",
                "csi.volume.kubernetes.io/nodeid": '{"ebs.csi.aws.com":"i-0a1b2c3d4e5f60718"}',
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "nvidia.com/gpu-driver-upgrade-enabled": "true",
            },
            "managedFields": managed_fields(lbls, ts),
        },
        "spec": {
            "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
            "taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
        },
        "status": {
            "capacity": {
                "cpu": "192", "ephemeral-storage": "3749899444Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "2097152000Ki", "nvidia.com/gpu": "8",
                "vpc.amazonaws.com/efa": "32", "pods": "100",
            },
            "allocatable": {
                "cpu": "191450m", "ephemeral-storage": "3454858918726", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "2083492864Ki", "nvidia.com/gpu": "8",
                "vpc.amazonaws.com/efa": "32", "pods": "100",
            },
            "conditions": [
                {"type": t, "status": s, "lastHeartbeatTime": ts, "lastTransitionTime": "2024-08-12T07:04:31Z",
                 "reason": r, "message": m}
                for t, s, r, m in [
                    ("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                    ("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                    ("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                    ("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                ]
            ],
            "addresses": [
                {"type": "InternalIP", "address": "10.42.17.23"},
                {"type": "InternalDNS", "address": "ip-10-42-17-23.ec2.internal"},
                {"type": "Hostname", "address": "ip-10-42-17-23.ec2.internal"},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": "ec2b7f3c9d1e4a5b6c7d8e9f0a1b2c3d",
                "systemUUID": "ec2b7f3c-9d1e-4a5b-6c7d-8e9f0a1b2c3d",
                "bootID": "3c2b1a09-8f7e-4d6c-5b4a-39281706f5e4",
                "kernelVersion": "5.15.0-1051-aws",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kubeletVersion": "v1.30.4",
                "kubeProxyVersion": "v1.30.4",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": images(),
        },
    }


def managed_fields(lbls, ts):
    def keys(prefixes):
        return {"f:" + k: {} for k in lbls if any(k.startswith(p) for p in prefixes)}
    return [
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": ts,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {
             ".": {}, "f:alpha.kubernetes.io/provided-node-ip": {},
             "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
             "f:labels": {".": {}, **keys(["kubernetes.io/", "beta.kubernetes.io/", "node.kubernetes.io/",
                                           "topology.kubernetes.io/", "failure-domain"])}},
             "f:spec": {"f:providerID": {}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": ts,
         "fieldsType": "FieldsV1", "subresource": "status", "fieldsV1": {"f:status": {
             "f:allocatable": {"f:nvidia.com/gpu": {}, "f:vpc.amazonaws.com/efa": {}},
             "f:capacity": {"f:nvidia.com/gpu": {}, "f:vpc.amazonaws.com/efa": {}},
             "f:conditions": {f'k:{{"type":"{t}"}}': {"f:lastHeartbeatTime": {}}
                              for t in ["DiskPressure", "MemoryPressure", "PIDPressure", "Ready"]},
             "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}},
        {"manager": "nfd-master", "operation": "Update", "apiVersion": "v1", "time": ts,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": keys(["feature.node.kubernetes.io/"])}}},
        {"manager": "gpu-operator", "operation": "Update", "apiVersion": "v1", "time": ts,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": keys([P, "nvidia.com/gpu.present"])}}},
        {"manager": "aws-cloud-controller-manager", "operation": "Update", "apiVersion": "v1", "time": ts,
         "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:taints": {}}}},
    ]


def review(uid, old, new):
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "requestKind": {"group": "", "version": "v1", "kind": "Node"},
            "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
            "name": NAME,
            "operation": "UPDATE",
            "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"],
                         "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=4f1c2e3d"]}},
            "object": new,
            "oldObject": old,
            "dryRun": False,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": "kubectl-label"},
        },
    }


def flip(base, key, value):
    new = copy.deepcopy(base)
    new["metadata"]["labels"][P + key] = value
    new["metadata"]["resourceVersion"] = "48213377"
    return new


def write(name, obj):
    text = json.dumps(obj, separators=(",", ":"))
    with open(os.path.join(OUT, name), "w") as f:
        f.write(text + "\n")
    return len(text)


os.makedirs(OUT, exist_ok=True)
base = node(labels(), "48213309")
size = write("large-node.json", base)
print(f"large-node.json: {len(base['metadata']['labels'])} labels, "
      f"{len(base['status']['images'])} images, {size} bytes")
for name, uid, key in [
    ("large-node-review-allowed.json", "6a0d8e2f-1b3c-4d5e-8f90-a1b2c3d4e5f6", "dcgm-exporter"),
    ("large-node-review-denied.json", "6a0d8e2f-1b3c-4d5e-8f90-a1b2c3d4e5f7", "container-toolkit"),
]:
    print(f"{name}: {write(name, review(uid, base, flip(base, key, 'false')))} bytes")
