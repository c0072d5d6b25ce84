//! The file audit at cluster scale: synthetic `kubectl get nodes -o json` and
//! `kubectl get pods -n gpu-operator -o json` of 1,000, 5,000 and 10,000 GPU
//! nodes with 10 operator pods each, parsed and audited.
//!
//! Each size runs in a child process (this same binary, re-executed), so its
//! peak RSS is its own. `GDG_BENCH_SMOKE=1` runs 100 nodes once, for CI.
//!
//!     cargo bench --bench audit
//!     GDG_BENCH_SMOKE=1 cargo bench --bench audit
//!
//! `GDG_BENCH_DIR=<dir>` keeps the generated files there (to run the CLI on them).

use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gpu_deploy_guard::audit::{self, output};
use gpu_deploy_guard::core::facts::operator_defaults;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::k8s::list as files;

const CHILD_ENV: &str = "GDG_BENCH_CHILD";

#[path = "shared/mod.rs"]
mod shared;

use shared::{DAEMONSETS, PODS_PER_NODE};

fn main() {
    if let Ok(spec) = std::env::var(CHILD_ENV) {
        child(&spec);
        return;
    }
    let smoke = std::env::var("GDG_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let (sizes, runs): (&[usize], usize) = if smoke {
        (&[100], 1)
    } else {
        (&[1_000, 5_000, 10_000], 3)
    };
    let temp = tempfile::tempdir().expect("a temporary directory");
    let kept = std::env::var_os("GDG_BENCH_DIR").map(PathBuf::from);
    let dir = kept.as_deref().unwrap_or(temp.path());
    println!(
        "{:>7} {:>8} {:>9} {:>9} {:>10} {:>10} {:>8} {:>10} {:>9}",
        "nodes",
        "pods",
        "nodes MB",
        "pods MB",
        "parse ms",
        "audit ms",
        "print ms",
        "total ms",
        "peak MB"
    );
    for &nodes in sizes {
        let (nodes_path, pods_path) = generate(dir, nodes);
        let mb = |p: &Path| std::fs::metadata(p).map_or(0.0, |m| m.len() as f64 / 1e6);
        // The fastest of `runs` children: the machine is shared, the slowest runs measure others.
        let best = (0..runs)
            .map(|_| run_child(&nodes_path, &pods_path))
            .min_by_key(|m| m.total)
            .expect("at least one run");
        println!(
            "{:>7} {:>8} {:>9.1} {:>9.1} {:>10} {:>10} {:>8} {:>10} {:>9.1}",
            nodes,
            nodes * PODS_PER_NODE,
            mb(&nodes_path),
            mb(&pods_path),
            best.parse.as_millis(),
            best.audit.as_millis(),
            best.print.as_millis(),
            best.total.as_millis(),
            best.peak_kb as f64 / 1024.0
        );
        assert_eq!(best.nodes, nodes, "every node is audited");
        assert_eq!(
            best.missing,
            nodes / 100,
            "one node in a hundred has a pod Pending"
        );
    }
}

struct Measured {
    parse: Duration,
    audit: Duration,
    print: Duration,
    total: Duration,
    peak_kb: u64,
    nodes: usize,
    missing: usize,
}

fn run_child(nodes: &Path, pods: &Path) -> Measured {
    let exe = std::env::current_exe().expect("the bench binary");
    let out = Command::new(exe)
        .env(
            CHILD_ENV,
            format!("{}\n{}", nodes.display(), pods.display()),
        )
        .output()
        .expect("the child runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let f: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().expect("numbers"))
        .collect();
    let us = Duration::from_micros;
    Measured {
        parse: us(f[0]),
        audit: us(f[1]),
        print: us(f[2]),
        total: us(f[0] + f[1] + f[2]),
        peak_kb: f[3],
        nodes: usize::try_from(f[4]).unwrap_or(usize::MAX),
        missing: usize::try_from(f[5]).unwrap_or(usize::MAX),
    }
}

/// One measured file audit, as `audit --nodes --pods` does it.
fn child(spec: &str) {
    let (nodes_path, pods_path) = spec.split_once('\n').expect("two paths");
    let start = Instant::now();
    let (nodes, pods) =
        files::read_nodes_and_pods(Path::new(nodes_path), Path::new(pods_path)).expect("parse");
    let parsed = Instant::now();
    let report = audit::audit(&nodes, &pods, &operator_defaults(), &Policy::default());
    let audited = Instant::now();
    let text = output::lines(&report);
    let printed = Instant::now();
    let missing = text.lines().filter(|l| l.contains(" MISSING ")).count();
    println!(
        "{} {} {} {} {} {}",
        (parsed - start).as_micros(),
        (audited - parsed).as_micros(),
        (printed - audited).as_micros(),
        peak_rss_kb(),
        report.nodes.len(),
        missing
    );
}

/// VmHWM: the most resident memory this process has had.
fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

/// Writes the two files for `count` GPU nodes.
fn generate(dir: &Path, count: usize) -> (PathBuf, PathBuf) {
    let nodes_path = dir.join(format!("nodes-{count}.json"));
    let pods_path = dir.join(format!("pods-{count}.json"));
    let mut nodes = BufWriter::new(File::create(&nodes_path).expect("create"));
    let mut pods = BufWriter::new(File::create(&pods_path).expect("create"));
    let mut buf = String::new();
    nodes
        .write_all(b"{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[")
        .expect("write");
    pods.write_all(b"{\"apiVersion\":\"v1\",\"kind\":\"List\",\"items\":[")
        .expect("write");
    for i in 0..count {
        let name = format!("gpu-node-{i:05}");
        buf.clear();
        node_json(&mut buf, &name, i);
        if i > 0 {
            nodes.write_all(b",").expect("write");
        }
        nodes.write_all(buf.as_bytes()).expect("write");
        for (j, (ds, _)) in DAEMONSETS.iter().enumerate() {
            // One node in a hundred has its DCGM exporter stuck in Init.
            let phase = if i % 100 == 7 && *ds == "nvidia-dcgm-exporter" {
                "Pending"
            } else {
                "Running"
            };
            buf.clear();
            pod_json(&mut buf, ds, &name, i, j, phase);
            if i > 0 || j > 0 {
                pods.write_all(b",").expect("write");
            }
            pods.write_all(buf.as_bytes()).expect("write");
        }
    }
    nodes
        .write_all(b"],\"metadata\":{\"resourceVersion\":\"\"}}")
        .expect("write");
    pods.write_all(b"],\"metadata\":{\"resourceVersion\":\"\"}}")
        .expect("write");
    nodes.flush().expect("flush");
    pods.flush().expect("flush");
    (nodes_path, pods_path)
}

/// A node as the API server returns it: ~40 labels, conditions, 30 images.
fn node_json(out: &mut String, name: &str, i: usize) {
    let _ = write!(
        out,
        r#"{{"apiVersion":"v1","kind":"Node","metadata":{{"name":"{name}","uid":"a1b2c3d4-{i:04x}-4000-8000-000000000000","resourceVersion":"{rv}","creationTimestamp":"2026-11-02T09:14:00Z","labels":{{"beta.kubernetes.io/arch":"amd64","beta.kubernetes.io/os":"linux","kubernetes.io/arch":"amd64","kubernetes.io/hostname":"{name}","kubernetes.io/os":"linux","node.kubernetes.io/instance-type":"p5.48xlarge","topology.kubernetes.io/region":"us-east-1","topology.kubernetes.io/zone":"us-east-1a","feature.node.kubernetes.io/pci-10de.present":"true","feature.node.kubernetes.io/cpu-model.vendor_id":"Intel","feature.node.kubernetes.io/kernel-version.full":"6.8.0-1015-aws","nvidia.com/cuda.driver.major":"570","nvidia.com/cuda.driver.minor":"124","nvidia.com/cuda.runtime.major":"12","nvidia.com/gpu.count":"8","nvidia.com/gpu.family":"hopper","nvidia.com/gpu.machine":"p5.48xlarge","nvidia.com/gpu.memory":"81559","nvidia.com/gpu.product":"NVIDIA-H100-80GB-HBM3","nvidia.com/gpu.present":"true","nvidia.com/mig.capable":"true","nvidia.com/mig.strategy":"single","#,
        rv = 100_000 + i
    );
    for (_, key) in DAEMONSETS {
        if let Some(key) = key {
            let _ = write!(out, r#""nvidia.com/gpu.deploy.{key}":"true","#);
        }
    }
    let _ = write!(
        out,
        r#""nvidia.com/gpu.deploy.node-status-exporter":"true"}},"annotations":{{"nfd.node.kubernetes.io/feature-labels":"cpu-model.vendor_id,kernel-version.full,pci-10de.present","node.alpha.kubernetes.io/ttl":"0","volumes.kubernetes.io/controller-managed-attach-detach":"true"}}}},"spec":{{"podCIDR":"10.{a}.{b}.0/24","providerID":"aws:///us-east-1a/i-0{i:016x}"}},"status":{{"capacity":{{"cpu":"192","memory":"2097152000Ki","nvidia.com/gpu":"8","pods":"110"}},"allocatable":{{"cpu":"191","memory":"2090000000Ki","nvidia.com/gpu":"8","pods":"110"}},"conditions":["#,
        a = i / 256,
        b = i % 256
    );
    for (k, c) in ["MemoryPressure", "DiskPressure", "PIDPressure", "Ready"]
        .iter()
        .enumerate()
    {
        let status = if *c == "Ready" { "True" } else { "False" };
        let _ = write!(
            out,
            r#"{}{{"type":"{c}","status":"{status}","lastHeartbeatTime":"2026-11-30T10:00:00Z","lastTransitionTime":"2026-11-02T09:14:00Z","reason":"Kubelet{c}","message":"kubelet reports {c}"}}"#,
            if k > 0 { "," } else { "" }
        );
    }
    out.push_str(r#"],"images":["#);
    for k in 0..30 {
        let _ = write!(
            out,
            r#"{}{{"names":["nvcr.io/nvidia/image-{k}@sha256:{k:064x}","nvcr.io/nvidia/image-{k}:v1.{k}"],"sizeBytes":{}}}"#,
            if k > 0 { "," } else { "" },
            100_000_000 + k * 7_919
        );
    }
    let _ = write!(
        out,
        r#"],"nodeInfo":{{"machineID":"{i:032x}","systemUUID":"ec2{i:05}","bootID":"b{i:031x}","kernelVersion":"6.8.0-1015-aws","osImage":"Ubuntu 22.04.5 LTS","containerRuntimeVersion":"containerd://1.7.27","kubeletVersion":"v1.33.2","kubeProxyVersion":"","operatingSystem":"linux","architecture":"amd64"}}}}}}"#
    );
}

/// An operator pod as `kubectl get pods -o json` writes it (managedFields are not shown).
fn pod_json(out: &mut String, ds: &str, node: &str, i: usize, j: usize, phase: &str) {
    let name = format!("{ds}-{:05x}", (i * 31 + j * 7) % 0x10_0000);
    let ready = if phase == "Running" { "True" } else { "False" };
    let _ = write!(
        out,
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","generateName":"{ds}-","namespace":"gpu-operator","uid":"c0ffee00-{i:04x}-4{j:03x}-8000-000000000000","resourceVersion":"{rv}","creationTimestamp":"2026-11-02T09:20:00Z","labels":{{"app":"{ds}","app.kubernetes.io/managed-by":"gpu-operator","controller-revision-hash":"7c9d8f6b5","helm.sh/chart":"gpu-operator-v25.10.1","pod-template-generation":"3"}},"annotations":{{"kubectl.kubernetes.io/default-container":"main"}},"ownerReferences":[{{"apiVersion":"apps/v1","kind":"DaemonSet","name":"{ds}","uid":"d5000000-0000-4000-8000-0000000000{j:02}","controller":true,"blockOwnerDeletion":true}}]}},"spec":{{"volumes":[{{"name":"run-nvidia","hostPath":{{"path":"/run/nvidia","type":"DirectoryOrCreate"}}}},{{"name":"host-root","hostPath":{{"path":"/","type":""}}}},{{"name":"kube-api-access","projected":{{"sources":[{{"serviceAccountToken":{{"expirationSeconds":3607,"path":"token"}}}}],"defaultMode":420}}}}],"initContainers":[{{"name":"toolkit-validation","image":"nvcr.io/nvidia/cloud-native/gpu-operator-validator:v25.10.1","command":["sh","-c"],"args":["until [ -f /run/nvidia/validations/toolkit-ready ]; do echo waiting; sleep 5; done"],"resources":{{}},"volumeMounts":[{{"name":"run-nvidia","mountPath":"/run/nvidia","mountPropagation":"HostToContainer"}}],"imagePullPolicy":"IfNotPresent","securityContext":{{"privileged":true}}}}],"containers":[{{"name":"main","image":"nvcr.io/nvidia/{ds}:v25.10.1","env":[{{"name":"NODE_NAME","valueFrom":{{"fieldRef":{{"apiVersion":"v1","fieldPath":"spec.nodeName"}}}}}},{{"name":"NVIDIA_VISIBLE_DEVICES","value":"all"}},{{"name":"NVIDIA_DRIVER_CAPABILITIES","value":"compute,utility"}}],"resources":{{"limits":{{"memory":"512Mi"}},"requests":{{"cpu":"50m","memory":"128Mi"}}}},"volumeMounts":[{{"name":"run-nvidia","mountPath":"/run/nvidia"}},{{"name":"kube-api-access","readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}}],"terminationMessagePath":"/dev/termination-log","terminationMessagePolicy":"File","imagePullPolicy":"IfNotPresent","securityContext":{{"privileged":true}}}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"dnsPolicy":"ClusterFirst","serviceAccountName":"{ds}","nodeName":"{node}","hostPID":true,"securityContext":{{}},"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{{"matchFields":[{{"key":"metadata.name","operator":"In","values":["{node}"]}}]}}]}}}}}},"schedulerName":"default-scheduler","tolerations":[{{"key":"nvidia.com/gpu","operator":"Exists","effect":"NoSchedule"}},{{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute"}},{{"key":"node.kubernetes.io/unreachable","operator":"Exists","effect":"NoExecute"}}],"priorityClassName":"system-node-critical","priority":2000001000,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"}},"status":{{"phase":"{phase}","conditions":[{{"type":"PodReadyToStartContainers","status":"True","lastTransitionTime":"2026-11-02T09:20:03Z"}},{{"type":"Initialized","status":"{ready}","lastTransitionTime":"2026-11-02T09:20:09Z"}},{{"type":"Ready","status":"{ready}","lastTransitionTime":"2026-11-02T09:20:15Z"}},{{"type":"ContainersReady","status":"{ready}","lastTransitionTime":"2026-11-02T09:20:15Z"}},{{"type":"PodScheduled","status":"True","lastTransitionTime":"2026-11-02T09:20:00Z"}}],"hostIP":"10.0.{a}.{b}","hostIPs":[{{"ip":"10.0.{a}.{b}"}}],"podIP":"10.1.{a}.{b}","podIPs":[{{"ip":"10.1.{a}.{b}"}}],"startTime":"2026-11-02T09:20:00Z","containerStatuses":[{{"name":"main","state":{{"running":{{"startedAt":"2026-11-02T09:20:14Z"}}}},"lastState":{{}},"ready":{running},"restartCount":0,"image":"nvcr.io/nvidia/{ds}:v25.10.1","imageID":"nvcr.io/nvidia/{ds}@sha256:{i:064x}","containerID":"containerd://{j:02}{i:062x}","started":{running}}}],"qosClass":"Burstable"}}}}"#,
        rv = 200_000 + i * PODS_PER_NODE + j,
        a = i / 256,
        b = i % 256,
        running = phase == "Running",
    );
}
