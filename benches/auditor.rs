//! What the continuous audit holds at fleet size, piece by piece: the node records every
//! replica keeps, the pod records the auditor adds (10 operator pods a node), the audit it keeps
//! between passes, and the peaks of a whole pass and of building the ClusterPolicyReport.
//! Heap bytes, counted by this binary's allocator (RSS adds the allocator's own overhead and
//! the binary; `make bench-scale` measures that on a real API server).
//!
//! Two fleets per size: clean (every expected operand Running) and broken (every node's
//! container toolkit pod Pending under a Running device plugin: a finding on every node, as
//! after an operator upgrade gone wrong).
//!
//!     cargo bench --bench auditor
//!     GDG_BENCH_SMOKE=1 cargo bench --bench auditor

use std::collections::BTreeMap;
use std::time::Instant;

use gpu_deploy_guard::audit::incremental::{Dirty, Incremental};
use gpu_deploy_guard::audit::report::{self, Outcome, Timestamp};
use gpu_deploy_guard::core::facts::operator_defaults;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::k8s::fleet::{LabelFilter, NodeIndex, PodIndex};
use gpu_deploy_guard::k8s::node::NodeView;
use gpu_deploy_guard::k8s::pod::{PodPhase, PodView};

#[path = "../tests/counting_alloc/mod.rs"]
mod counting_alloc;
#[path = "shared/mod.rs"]
mod shared;

use counting_alloc::{Counting, held, mark, peak_since};
use shared::DAEMONSETS;

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// A GPU node as a cloud provider and the operator label it: 40 labels, 8 of them deploy labels.
fn node(i: usize) -> NodeView {
    let name = format!("gpu-node-{i:05}.us-west-2.compute.internal");
    let mut labels = BTreeMap::new();
    for (_, label) in DAEMONSETS {
        if let Some(op) = label {
            labels.insert(format!("nvidia.com/gpu.deploy.{op}"), "true".to_owned());
        }
    }
    for (k, v) in [
        ("nvidia.com/gpu.present", "true"),
        ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "8"),
        ("nvidia.com/gpu.memory", "81559"),
        ("nvidia.com/cuda.driver.major", "550"),
        ("nvidia.com/mig.capable", "true"),
        ("nvidia.com/mig.config", "all-disabled"),
        ("nvidia.com/mig.config.state", "success"),
        ("kubernetes.io/arch", "amd64"),
        ("kubernetes.io/os", "linux"),
        ("node.kubernetes.io/instance-type", "p5.48xlarge"),
        ("topology.kubernetes.io/region", "us-west-2"),
        ("topology.kubernetes.io/zone", "us-west-2a"),
    ] {
        labels.insert(k.to_owned(), v.to_owned());
    }
    labels.insert("kubernetes.io/hostname".to_owned(), name.clone());
    for j in 0..17 {
        labels.insert(
            format!("example.com/team-label-{j}"),
            format!("value-{}", (i + j) % 97),
        );
    }
    let mut n = NodeView::default();
    n.metadata.name = Some(name);
    n.metadata.labels = Some(labels);
    n
}

fn pod(ds: &str, node: &str, i: usize, phase: PodPhase) -> PodView {
    let mut p = PodView {
        node: Some(node.to_owned()),
        phase,
        daemonset: Some(ds.to_owned()),
        owned: true,
        ..PodView::default()
    };
    p.metadata.name = Some(format!("{ds}-{:05x}", i * 7919 % 0xfffff));
    p
}

struct Row {
    nodes_kept: usize,
    pods_kept: usize,
    audit_kept: usize,
    pass_peak: usize,
    pass_ms: u128,
    report_peak: usize,
    report_kept: usize,
    report_ms: u128,
    failing: usize,
}

fn measure(n: usize, broken: bool) -> Row {
    let facts = operator_defaults();
    let policy = Policy::default();

    let at = mark();
    let mut nodes = NodeIndex::new(LabelFilter::new(&facts));
    nodes.start_relist();
    let mut names = Vec::with_capacity(n);
    for i in 0..n {
        let view = node(i);
        names.push(view.metadata.name.clone().unwrap_or_default());
        nodes.relist_apply(&view);
    }
    nodes.finish_relist();
    let nodes_kept =
        held() - at - names.iter().map(String::capacity).sum::<usize>() - names.capacity() * 24;

    let at = mark();
    let mut pods = PodIndex::default();
    pods.start_relist();
    for (i, name) in names.iter().enumerate() {
        for (ds, _) in DAEMONSETS {
            let phase = if broken && ds == "nvidia-container-toolkit-daemonset" {
                PodPhase::Pending
            } else {
                PodPhase::Running
            };
            pods.relist_apply(&pod(ds, name, i, phase));
        }
    }
    pods.finish_relist();
    let pods_kept = held() - at;
    drop(names);

    let at = mark();
    let started = Instant::now();
    let mut incremental = Incremental::default();
    incremental.update(&nodes, &pods, &facts, &policy, Dirty::All, 0);
    let pass_ms = started.elapsed().as_millis();
    let pass_peak = peak_since(at);
    let audit_kept = held() - at;
    let audit = incremental.audit().expect("an audit after a pass");
    let failing = audit.nodes.iter().filter(|n| n.fails()).count();

    let at = mark();
    let started = Instant::now();
    let built = report::build_from(
        audit,
        |name| incremental.detail(name, &nodes, &pods, &policy),
        Timestamp {
            seconds: 1_796_032_800,
            nanos: 0,
        },
    );
    let report_ms = started.elapsed().as_millis();
    let report_peak = peak_since(at);
    let report_kept = held() - at;
    assert!(built.results.len() <= report::MAX_RESULTS);
    if broken {
        assert!(built.results.iter().any(|r| r.result == Outcome::Fail));
    }
    Row {
        nodes_kept,
        pods_kept,
        audit_kept,
        pass_peak,
        pass_ms,
        report_peak,
        report_kept,
        report_ms,
        failing,
    }
}

fn main() {
    let smoke = std::env::var("GDG_BENCH_SMOKE").is_ok_and(|v| v == "1");
    let sizes: &[usize] = if smoke { &[200] } else { &[5_000, 15_000] };
    println!(
        "{:>7} {:>7} {:>8} {:>9} {:>9} {:>9} {:>10} {:>8} {:>11} {:>11} {:>9}",
        "nodes",
        "fleet",
        "failing",
        "nodes MiB",
        "pods MiB",
        "audit MiB",
        "pass peak",
        "pass ms",
        "report peak",
        "report MiB",
        "report ms"
    );
    for &n in sizes {
        for broken in [false, true] {
            let r = measure(n, broken);
            println!(
                "{:>7} {:>7} {:>8} {:>9.2} {:>9.2} {:>9.2} {:>10.2} {:>8} {:>11.2} {:>11.2} {:>9}",
                n,
                if broken { "broken" } else { "clean" },
                r.failing,
                mib(r.nodes_kept),
                mib(r.pods_kept),
                mib(r.audit_kept),
                mib(r.pass_peak),
                r.pass_ms,
                mib(r.report_peak),
                mib(r.report_kept),
                r.report_ms
            );
            assert_eq!(
                r.failing,
                if broken { n } else { 0 },
                "the fleet is as built"
            );
        }
    }
}
