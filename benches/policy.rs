//! The GPU-policy decision over a fleet: what `POST /validate/gpu-policy` does after parsing,
//! on node records as `serve` keeps them (the large-node fixture's labels): group the records,
//! make each group's label map, and decide a ClusterPolicy switching the toolkit off
//! (`policy_decision::decide_objects`). Fleets of 5,000 and 15,000 nodes in 8 kinds of
//! node (a usual fleet: a few GPU models and MIG layouts), and 15,000 in 300 kinds (a very
//! mixed one).

mod common;

use std::hint::black_box;

use common::Case;
use gpu_deploy_guard::core::facts::operator_defaults;
use gpu_deploy_guard::core::policy::{Decision, Policy};
use gpu_deploy_guard::core::policy_change::PolicyKind;
use gpu_deploy_guard::core::review::Operation;
use gpu_deploy_guard::k8s::fleet::{LabelFilter, NodeIndex, SharedFleet};
use gpu_deploy_guard::k8s::read;
use gpu_deploy_guard::policy_decision::{ObjectChange, decide_objects};
use serde_json::{Value, json};

fn fleet(nodes: usize, kinds: usize) -> SharedFleet {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let template = read::node_file(&root.join("benches/fixtures/large-node.json")).unwrap();
    let facts = operator_defaults();
    let fleet = SharedFleet::default();
    {
        let mut state = fleet.lock();
        state.nodes = NodeIndex::new(LabelFilter::new(&facts));
        for i in 0..nodes {
            let mut node = template.clone();
            node.metadata.name = Some(format!("gpu-node-{i:05}"));
            let labels = node.metadata.labels.get_or_insert_default();
            for op in ["container-toolkit", "device-plugin", "driver"] {
                labels.insert(format!("nvidia.com/gpu.deploy.{op}"), "true".into());
            }
            labels.insert("nvidia.com/gpu.present".into(), "true".into());
            labels.insert(
                "feature.node.kubernetes.io/pci-10de.present".into(),
                "true".into(),
            );
            // The kind of node: a label decisions read (the MIG heuristic reads the product).
            labels.insert(
                "nvidia.com/gpu.product".into(),
                format!("NVIDIA-GPU-MODEL-{}", i % kinds),
            );
            state.nodes.apply(&node);
        }
        state.synced = true;
    }
    fleet
}

fn policy(toolkit: bool) -> Value {
    json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"toolkit": {"enabled": toolkit}, "devicePlugin": {"enabled": true}}})
}

fn case(nodes: usize, kinds: usize) -> Case {
    let fleet = fleet(nodes, kinds);
    let new: &'static Value = Box::leak(Box::new(policy(false)));
    let old: &'static Value = Box::leak(Box::new(policy(true)));
    let facts = operator_defaults();
    let rules = Policy::default();
    let change = ObjectChange {
        kind: PolicyKind::ClusterPolicy,
        operation: Operation::Update,
        name: "cluster-policy",
        object: Some(new),
        old: Some(old),
        username: "alice",
        groups: &[],
        dry_run: false,
    };
    // The case must mean what its name says: a refusal naming all the nodes.
    let v = decide_objects(&change, &facts, Some(&fleet), &rules).unwrap();
    assert_eq!(v.decision, Decision::Denied);
    assert!(
        v.message
            .as_deref()
            .unwrap()
            .contains(&format!("on {nodes} nodes")),
        "{:?}",
        v.message
    );
    Case::new(
        format!("toolkit-off/{nodes}-nodes-{kinds}-kinds"),
        move || {
            black_box(decide_objects(black_box(&change), &facts, Some(&fleet), &rules).unwrap());
        },
    )
}

fn main() {
    let smoke = std::env::var_os("GDG_BENCH_SMOKE").is_some_and(|v| v == "1");
    let sizes: &[(usize, usize)] = if smoke {
        &[(500, 8)]
    } else {
        &[(5_000, 8), (15_000, 8), (15_000, 300)]
    };
    common::main("policy", sizes.iter().map(|&(n, k)| case(n, k)).collect());
}
