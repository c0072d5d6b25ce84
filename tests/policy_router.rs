//! `POST /validate/gpu-policy` through `oneshot`: ClusterPolicy and NVIDIADriver
//! AdmissionReviews decided over a fleet of node records, and the bad inputs.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use gpu_deploy_guard::core::facts::ClusterFacts;
use gpu_deploy_guard::core::policy::Policy;
use gpu_deploy_guard::k8s::fleet::{Dirty, LabelFilter, NodeIndex, SharedFleet};
use gpu_deploy_guard::k8s::node::NodeView;
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::webhook::{Limits, Webhook, router};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

fn gpu_node(name: &str) -> NodeView {
    let mut n = NodeView::default();
    n.metadata.name = Some(name.to_owned());
    let mut labels: std::collections::BTreeMap<String, String> = [
        "driver",
        "container-toolkit",
        "device-plugin",
        "gpu-feature-discovery",
        "dcgm-exporter",
    ]
    .iter()
    .map(|op| (format!("nvidia.com/gpu.deploy.{op}"), "true".to_owned()))
    .collect();
    labels.insert(
        "feature.node.kubernetes.io/pci-10de.present".into(),
        "true".into(),
    );
    labels.insert("nvidia.com/gpu.present".into(), "true".into());
    // NFD's OS labels put the node in an NVIDIADriver's pool.
    labels.insert(
        "feature.node.kubernetes.io/system-os_release.ID".into(),
        "ubuntu".into(),
    );
    labels.insert(
        "feature.node.kubernetes.io/system-os_release.VERSION_ID".into(),
        "22.04".into(),
    );
    labels.insert("kubernetes.io/hostname".into(), name.into());
    n.metadata.labels = Some(labels);
    n
}

struct Harness {
    metrics: Arc<Metrics>,
    app: axum::Router,
    fleet: Arc<SharedFleet>,
}

/// A webhook whose fleet holds `nodes`, listed (`synced`) or not.
fn harness(nodes: &[NodeView], synced: bool) -> Harness {
    harness_with(nodes, synced, ClusterFacts::default())
}

fn harness_with(nodes: &[NodeView], synced: bool, facts: ClusterFacts) -> Harness {
    let metrics = Arc::new(Metrics::new());
    let mut hook = Webhook::new(
        Policy::default(),
        facts.clone(),
        metrics.clone(),
        Limits::default(),
    );
    let fleet = Arc::new(SharedFleet::default());
    {
        let mut state = fleet.lock();
        state.nodes = NodeIndex::new(LabelFilter::new(&facts));
        for n in nodes {
            state.nodes.apply(n);
        }
        state.synced = synced;
        state.dirty = Dirty::All;
    }
    hook.fleet = Some(fleet.clone());
    Harness {
        metrics,
        app: router(Arc::new(hook)),
        fleet,
    }
}

fn cluster_policy(toolkit: bool, device_plugin: bool, annotations: Value) -> Value {
    json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy", "annotations": annotations},
        "spec": {"toolkit": {"enabled": toolkit}, "devicePlugin": {"enabled": device_plugin}}})
}

fn review(kind: &str, operation: &str, object: Value, old: Value) -> Value {
    let group_version = if kind == "ClusterPolicy" {
        "v1"
    } else {
        "v1alpha1"
    };
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "u-1", "kind": {"group": "nvidia.com", "version": group_version, "kind": kind},
        "resource": {"group": "nvidia.com", "version": group_version, "resource": "x"},
        "name": object.pointer("/metadata/name").or(old.pointer("/metadata/name")).cloned().unwrap_or(json!("")),
        "operation": operation, "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": object, "oldObject": old}})
}

/// A ClusterPolicy UPDATE from `old` to `new`, as the webhook answers it.
async fn update(h: &Harness, new: Value, old: Value) -> Value {
    post(h, &review("ClusterPolicy", "UPDATE", new, old))
        .await
        .1
}

async fn post(h: &Harness, body: &Value) -> (StatusCode, Value) {
    let req = Request::post("/validate/gpu-policy")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(serde_json::to_vec(body).unwrap()))
        .unwrap();
    let resp = h.app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn turning_the_toolkit_off_is_refused_naming_the_nodes_and_counted_as_a_policy_review() {
    let h = harness(&[gpu_node("gpu-b"), gpu_node("gpu-a")], true);
    let body = review(
        "ClusterPolicy",
        "UPDATE",
        cluster_policy(false, true, json!({})),
        cluster_policy(true, true, json!({})),
    );
    let (status, answer) = post(&h, &body).await;
    assert_eq!(status, StatusCode::OK);
    let r = &answer["response"];
    assert_eq!(r["uid"], "u-1");
    assert_eq!(r["allowed"], false);
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (gpu-a, gpu-b)"),
        "{msg}"
    );
    assert_eq!(r["status"]["code"], 403);
    assert_eq!(
        r["auditAnnotations"]["policy-change"],
        "ClusterPolicy/cluster-policy"
    );
    assert_eq!(r["auditAnnotations"]["nodes"], "2");
    let text = h.metrics.encode();
    assert!(
        text.contains(r#"gpu_deploy_guard_policy_reviews_total{kind="ClusterPolicy",decision="denied",operation="UPDATE"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"gpu_deploy_guard_policy_findings_total{kind="ClusterPolicy",rule="toolkit-switched-off",action="deny"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("gpu_deploy_guard_admission_reviews_total{"),
        "a policy review is not a node review: {text}"
    );
}

#[tokio::test]
async fn the_host_toolkit_annotation_in_the_same_request_lets_it_through_once() {
    let h = harness(&[gpu_node("gpu-a")], true);
    let said = json!({"gpu-deploy-guard.nvidia.com/toolkit-on-hosts": "baked into the image"});
    let answer = update(
        &h,
        cluster_policy(false, true, said.clone()),
        cluster_policy(true, true, json!({})),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["auditAnnotations"]["override"],
        "gpu-deploy-guard.nvidia.com/toolkit-on-hosts=baked into the image"
    );
    // Left on the object from an earlier request, it says nothing about this one.
    let answer = update(
        &h,
        cluster_policy(false, true, said.clone()),
        cluster_policy(true, true, said),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    // A reason of blanks or invisible characters says nothing.
    for blank in [" ", "\u{200b}", " \u{200b}\u{feff} "] {
        let (_, answer) = post(
            &h,
            &review(
                "ClusterPolicy",
                "UPDATE",
                cluster_policy(
                    false,
                    true,
                    json!({"gpu-deploy-guard.nvidia.com/toolkit-on-hosts": blank}),
                ),
                cluster_policy(true, true, json!({})),
            ),
        )
        .await;
        assert_eq!(answer["response"]["allowed"], false, "{blank:?}: {answer}");
    }
}

#[tokio::test]
async fn before_the_nodes_are_listed_the_policy_alone_decides_and_says_so() {
    let h = harness(&[], false);
    let answer = update(
        &h,
        cluster_policy(false, true, json!({})),
        cluster_policy(true, true, json!({})),
    )
    .await;
    let r = &answer["response"];
    assert_eq!(r["allowed"], false);
    assert!(
        r["status"]["message"]
            .as_str()
            .unwrap()
            .contains("the nodes are not known: the nodes are not listed yet"),
        "{r}"
    );
    assert_eq!(r["auditAnnotations"]["nodes"], "unknown");
}

#[tokio::test]
async fn consistent_and_unrelated_changes_pass_and_status_is_not_judged() {
    let h = harness(&[gpu_node("gpu-a")], true);
    // Toolkit and device plugin off together: no GPU pod is scheduled; allowed, with the
    // warnings that the node's GPUs are no longer advertised and that its other operands lose
    // the runtime the leaving toolkit removes.
    let answer = update(
        &h,
        cluster_policy(false, false, json!({})),
        cluster_policy(true, true, json!({})),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!([
            "ClusterPolicy cluster-policy: the device plugin stops on 1 node (gpu-a); their GPUs are no longer advertised",
            "ClusterPolicy cluster-policy: operand-without-toolkit on 1 node (gpu-a)"
        ]),
        "{answer}"
    );
    // An unrelated change: nothing said.
    let answer = update(
        &h,
        cluster_policy(true, true, json!({"team": "gpu"})),
        cluster_policy(true, true, json!({})),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"]["warnings"].is_null(), "{answer}");
    let mut status = review(
        "ClusterPolicy",
        "UPDATE",
        cluster_policy(false, true, json!({})),
        cluster_policy(true, true, json!({})),
    );
    status["request"]["subResource"] = json!("status");
    let (_, answer) = post(&h, &status).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test]
async fn nvidiadrivers_that_overlap_are_refused_and_a_delete_warns() {
    let h = harness(&[gpu_node("gpu-a")], true);
    let driver = |name: &str, selector: Value| {
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": name}, "spec": {"driverType": "gpu", "nodeSelector": selector}})
    };
    // No other NVIDIADriver is known to this webhook: a delete leaves gpu-a without a driver.
    let (_, answer) = post(
        &h,
        &review(
            "NVIDIADriver",
            "DELETE",
            Value::Null,
            driver("all", json!({})),
        ),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(
        answer["response"]["warnings"],
        json!(["NVIDIADriver all: 1 node loses the driver DaemonSet (gpu-a)"])
    );
    // With an NVIDIADriver selecting every node, a second one for gpu-a overlaps.
    let facts = ClusterFacts {
        nvidia_drivers: Some(vec![gpu_deploy_guard::core::nvidia_driver::NvidiaDriver {
            name: "all".into(),
            node_selector: Some(Default::default()),
            ..Default::default()
        }]),
        ..ClusterFacts::default()
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, facts);
    let (_, answer) = post(
        &h,
        &review(
            "NVIDIADriver",
            "CREATE",
            driver("gpu-a-only", json!({"nvidia.com/gpu.present": "true"})),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("NVIDIADriver gpu-a-only: its nodeSelector selects 1 node that NVIDIADriver all selects too (gpu-a)"),
        "{answer}"
    );
    // A selector on a label no record holds: its overlap cannot be checked, so it is refused,
    // and the records are asked to keep that label from now on.
    let by_host = review(
        "NVIDIADriver",
        "CREATE",
        driver("by-host", json!({"kubernetes.io/hostname": "gpu-a"})),
        Value::Null,
    );
    let (_, answer) = post(&h, &by_host).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("NVIDIADriver by-host: its nodeSelector reads kubernetes.io/hostname, which the guard had not read from the nodes"),
        "{answer}"
    );
    assert!(
        h.fleet
            .lock()
            .requested_keys
            .contains("kubernetes.io/hostname")
    );
    // The node follower reads it (here by hand): sent again, the overlap itself is judged.
    {
        let mut state = h.fleet.lock();
        let wider = state
            .nodes
            .filter()
            .with_keys(&state.requested_keys.clone());
        state.nodes.set_filter(wider);
        let mut node = gpu_node("gpu-a");
        node.metadata
            .labels
            .get_or_insert_default()
            .insert("kubernetes.io/hostname".into(), "gpu-a".into());
        state.nodes.apply(&node);
    }
    let (_, answer) = post(&h, &by_host).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("NVIDIADriver by-host: its nodeSelector selects 1 node that NVIDIADriver all selects too (gpu-a)"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_changed_nodeselector_asks_the_records_for_the_old_and_the_new_keys() {
    let facts = ClusterFacts {
        nvidia_drivers: Some(Vec::new()),
        ..ClusterFacts::default()
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, facts);
    let driver = |name: &str, selector: Value| {
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": name}, "spec": {"driverType": "gpu", "nodeSelector": selector}})
    };
    let moved = review(
        "NVIDIADriver",
        "UPDATE",
        driver("pool", json!({"example.com/pool": "b"})),
        driver("pool", json!({"example.com/rack": "7"})),
    );
    let (_, answer) = post(&h, &moved).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let requested = h.fleet.lock().requested_keys.clone();
    // The old selector's key too: which nodes the driver leaves needs it.
    for key in ["example.com/pool", "example.com/rack"] {
        assert!(requested.contains(key), "{key} not in {requested:?}");
    }
}

#[tokio::test]
async fn bad_policy_reviews_are_named() {
    let h = harness(&[], true);
    let mut node = review("ClusterPolicy", "UPDATE", json!({}), json!({}));
    node["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Node"});
    let (status, answer) = post(&h, &node).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("only ClusterPolicy and NVIDIADriver (nvidia.com) are reviewed at /validate/gpu-policy, got /Node"),
        "{answer}"
    );
    let bad_switch = review(
        "ClusterPolicy",
        "UPDATE",
        json!({"metadata": {"name": "p"}, "spec": {"toolkit": {"enabled": "no"}}}),
        cluster_policy(true, true, json!({})),
    );
    let (status, answer) = post(&h, &bad_switch).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let msg = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.contains("spec.toolkit.enabled: expected true or false"),
        "{msg}"
    );
    let missing_old = review(
        "ClusterPolicy",
        "UPDATE",
        cluster_policy(true, true, json!({})),
        Value::Null,
    );
    let (status, _) = post(&h, &missing_old).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// The facts of a cluster whose followed ClusterPolicy is `cluster-policy` (toolkit and device
/// plugin on), with `next` (toolkit off) beside it: the one the operator follows next.
fn facts_with_next_policy() -> ClusterFacts {
    use gpu_deploy_guard::core::facts::PolicySource;
    use gpu_deploy_guard::k8s::cluster_policy::from_object;
    let followed = from_object(&cluster_policy(true, true, json!({}))).unwrap();
    let mut second = cluster_policy(false, true, json!({}));
    second["metadata"]["name"] = json!("second");
    let next = from_object(&second).unwrap();
    ClusterFacts {
        source: PolicySource::Found(followed.name),
        next_policy: Some(Box::new((next.name, next.facts))),
        ..followed.facts
    }
}

#[tokio::test]
async fn deleting_the_followed_cluster_policy_is_judged_as_the_hand_over_to_the_next_one() {
    let nodes = [gpu_node("gpu-a"), gpu_node("gpu-b")];
    let h = harness_with(&nodes, true, facts_with_next_policy());
    let delete = |name: &str| {
        let mut old = cluster_policy(name == "cluster-policy", true, json!({}));
        old["metadata"]["name"] = json!(name);
        review("ClusterPolicy", "DELETE", Value::Null, old)
    };
    let (_, answer) = post(&h, &delete("cluster-policy")).await;
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    let msg = r["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("ClusterPolicy cluster-policy (deleted: the GPU Operator then follows ClusterPolicy second): spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (gpu-a, gpu-b)"),
        "{msg}"
    );
    let text = h.metrics.encode();
    assert!(
        text.contains(r#"gpu_deploy_guard_policy_reviews_total{kind="ClusterPolicy",decision="denied",operation="DELETE"} 1"#),
        "{text}"
    );
    // The ignored one goes: the operator follows the same ClusterPolicy as before.
    let (_, answer) = post(&h, &delete("second")).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("warnings").is_none(), "{answer}");
    // The only one goes: its DaemonSets go with it, or stay orphaned; no switch changes.
    let alone = ClusterFacts {
        next_policy: None,
        ..facts_with_next_policy()
    };
    let h = harness_with(&nodes, true, alone);
    let (_, answer) = post(&h, &delete("cluster-policy")).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test]
async fn a_first_cluster_policy_is_judged_against_the_operand_daemonsets_that_run() {
    use gpu_deploy_guard::core::facts::PolicySource;
    use gpu_deploy_guard::core::operands::{Operand, OperandSet};
    let nodes = [gpu_node("gpu-a"), gpu_node("gpu-b")];
    let create = review(
        "ClusterPolicy",
        "CREATE",
        cluster_policy(false, true, json!({})),
        Value::Null,
    );
    let no_policy = |daemonsets: Option<OperandSet>| ClusterFacts {
        source: PolicySource::Missing("no ClusterPolicy object exists".into()),
        daemonsets,
        ..ClusterFacts::default()
    };
    // The DaemonSets of a ClusterPolicy deleted with --cascade=orphan run on: a new one with the
    // toolkit off deletes the toolkit's under the running device plugins.
    let orphans = OperandSet::of(&[
        Operand::Driver,
        Operand::ContainerToolkit,
        Operand::DevicePlugin,
        Operand::GpuFeatureDiscovery,
        Operand::DcgmExporter,
    ]);
    let h = harness_with(&nodes, true, no_policy(Some(orphans)));
    let (_, answer) = post(&h, &create).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    let msg = answer["response"]["status"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes"),
        "{msg}"
    );
    // Nothing runs yet (a first install): nothing is taken away.
    let h = harness_with(&nodes, true, no_policy(Some(OperandSet::EMPTY)));
    let (_, answer) = post(&h, &create).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    // The DaemonSets not listed: judged as if the operator's defaults ran.
    let h = harness_with(&nodes, true, no_policy(None));
    let (_, answer) = post(&h, &create).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
}

#[tokio::test]
async fn two_creations_in_a_row_are_judged_against_each_other_before_the_watch_shows_the_first() {
    let driver = |name: &str| {
        json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "NVIDIADriver",
            "metadata": {"name": name}, "spec": {"driverType": "gpu", "nodeSelector": {"nvidia.com/gpu.present": "true"}}})
    };
    let facts = ClusterFacts {
        nvidia_drivers: Some(Vec::new()),
        ..ClusterFacts::default()
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, facts);
    let create = |name: &str, dry_run: bool| {
        let mut r = review("NVIDIADriver", "CREATE", driver(name), Value::Null);
        r["request"]["dryRun"] = json!(dry_run);
        r
    };
    // A dry run creates nothing: the next request does not meet it.
    let (_, answer) = post(&h, &create("first", true)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let (_, answer) = post(&h, &create("first", false)).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    // The watch (fixed here) never shows "first"; the second creation meets it all the same.
    let (_, answer) = post(&h, &create("second", false)).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("NVIDIADriver second: its nodeSelector selects 1 node that NVIDIADriver first selects too (gpu-a)"),
        "{answer}"
    );
}

#[tokio::test]
async fn a_gpu_cluster_created_right_after_a_cluster_policy_is_refused() {
    use gpu_deploy_guard::core::facts::PolicySource;
    let facts = ClusterFacts {
        source: PolicySource::Missing("no ClusterPolicy object exists".into()),
        daemonsets: Some(Default::default()),
        ..ClusterFacts::default()
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, facts);
    let (_, answer) = post(
        &h,
        &review(
            "ClusterPolicy",
            "CREATE",
            cluster_policy(true, true, json!({})),
            Value::Null,
        ),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let gpu_cluster = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": {}});
    let (_, answer) = post(
        &h,
        &review("GPUCluster", "CREATE", gpu_cluster, Value::Null),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("GPUCluster gpu-cluster: ClusterPolicy cluster-policy exists"),
        "{answer}"
    );
}

/// A ClusterPolicy (`toolkit` as given) and a GPUCluster both exist (v26.7: the operator
/// reconciles neither), with the lab's operand DaemonSets running.
fn both_stacks(toolkit: bool) -> ClusterFacts {
    use gpu_deploy_guard::core::facts::PolicySource;
    use gpu_deploy_guard::core::operands::{Operand, OperandSet, Stack};
    use gpu_deploy_guard::k8s::cluster_policy::from_object;
    let policy = from_object(&cluster_policy(toolkit, true, json!({}))).unwrap();
    ClusterFacts {
        source: PolicySource::Found(policy.name),
        stack: Stack::Both,
        daemonsets: Some(OperandSet::of(&[
            Operand::Driver,
            Operand::ContainerToolkit,
            Operand::DevicePlugin,
        ])),
        ..policy.facts
    }
}

#[tokio::test]
async fn while_both_stacks_exist_a_toolkit_switch_off_waiting_for_the_gpu_cluster_to_go_is_refused()
{
    let nodes = [gpu_node("gpu-a"), gpu_node("gpu-b")];
    let h = harness_with(&nodes, true, both_stacks(true));
    let answer = update(
        &h,
        cluster_policy(false, true, json!({})),
        cluster_policy(true, true, json!({})),
    )
    .await;
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert!(
        r["status"]["message"].as_str().unwrap().starts_with(
            "ClusterPolicy cluster-policy: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (gpu-a, gpu-b)"
        ),
        "{answer}"
    );
    assert!(
        r["warnings"].as_array().unwrap().iter().any(|w| w
            .as_str()
            .unwrap()
            .contains("GPUCluster gpu-cluster exists too")),
        "{answer}"
    );
    // Unrelated edits stay a warning about the conflict.
    let answer = update(
        &h,
        cluster_policy(true, true, json!({"note": "x"})),
        cluster_policy(true, true, json!({})),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test]
async fn deleting_the_gpu_cluster_beside_a_cluster_policy_is_judged_as_that_policy_taking_over() {
    let nodes = [gpu_node("gpu-a"), gpu_node("gpu-b")];
    let gpu_cluster = json!({"apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": {}});
    // The ClusterPolicy beside it has the toolkit off: its taking over deletes the toolkit.
    let h = harness_with(&nodes, true, both_stacks(false));
    let (_, answer) = post(
        &h,
        &review("GPUCluster", "DELETE", Value::Null, gpu_cluster.clone()),
    )
    .await;
    let r = &answer["response"];
    assert_eq!(r["allowed"], false, "{answer}");
    assert!(
        r["status"]["message"].as_str().unwrap().starts_with(
            "GPUCluster gpu-cluster (deleted: the GPU Operator then follows ClusterPolicy cluster-policy): spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running on 2 nodes (gpu-a, gpu-b)"
        ),
        "{answer}"
    );
    // With the toolkit on it takes nothing away.
    let h = harness_with(&nodes, true, both_stacks(true));
    let (_, answer) = post(
        &h,
        &review("GPUCluster", "DELETE", Value::Null, gpu_cluster),
    )
    .await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}

#[tokio::test]
async fn a_cluster_policy_is_refused_while_whether_a_gpu_cluster_exists_is_not_known() {
    use gpu_deploy_guard::core::facts::PolicySource;
    let facts = ClusterFacts {
        source: PolicySource::Missing("no ClusterPolicy object exists".into()),
        daemonsets: Some(Default::default()),
        gpu_clusters_unknown: Some("RBAC forbids listing gpuclusters.nvidia.com".into()),
        ..ClusterFacts::default()
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, facts.clone());
    let create = review(
        "ClusterPolicy",
        "CREATE",
        cluster_policy(true, true, json!({})),
        Value::Null,
    );
    let (_, answer) = post(&h, &create).await;
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .starts_with("ClusterPolicy cluster-policy: whether a GPUCluster exists is not known (RBAC forbids listing gpuclusters.nvidia.com)"),
        "{answer}"
    );
    // Known (listed, or no such CRD): created as before.
    let known = ClusterFacts {
        gpu_clusters_unknown: None,
        ..facts
    };
    let h = harness_with(&[gpu_node("gpu-a")], true, known);
    let (_, answer) = post(&h, &create).await;
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
}
