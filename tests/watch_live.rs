//! `watch_cluster` against a real API server: facts for the webhook, gauges,
//! the fallback without a ClusterPolicy, the report, and series of deleted nodes.
//!
//! Needs a throwaway cluster (it creates and deletes nodes), so it is ignored by
//! default; run it with a kubeconfig of cluster-admin:
//!
//!     GDG_TEST_KUBECONFIG=/path/admin.kubeconfig cargo test --test watch_live -- --ignored
//!
//! No scheduler or kubelet is needed: pods are created bound to nodes and their
//! phase is written through the status subresource.

use std::sync::Arc;
use std::time::Duration;

use gpu_deploy_guard::audit::cluster::{cluster_policy_resource, report_resource};
use gpu_deploy_guard::cluster_watch::{WatchConfig, watch_cluster};
use gpu_deploy_guard::metrics::Metrics;
use gpu_deploy_guard::policy::{ClusterFacts, Policy};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::json;
use tokio::sync::{oneshot, watch};

const NS: &str = "gdg-watch-test";
const N0: &str = "gdg-watch-0";
const N1: &str = "gdg-watch-1";
const P: &str = "nvidia.com/gpu.deploy.";

async fn client() -> Client {
    let path = std::env::var("GDG_TEST_KUBECONFIG")
        .expect("GDG_TEST_KUBECONFIG must name the kubeconfig of a throwaway cluster");
    let kubeconfig = Kubeconfig::read_from(&path).expect("a readable kubeconfig");
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("a usable kubeconfig");
    Client::try_from(config).expect("a client")
}

fn apply() -> PatchParams {
    PatchParams::apply("gdg-watch-test").force()
}

async fn node(client: &Client, name: &str, deploy: &[&str]) {
    let mut labels = serde_json::Map::new();
    labels.insert("nvidia.com/gpu.present".into(), json!("true"));
    for d in deploy {
        labels.insert(format!("{P}{d}"), json!("true"));
    }
    let body =
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}});
    Api::<Node>::all(client.clone())
        .patch(name, &apply(), &Patch::Apply(body))
        .await
        .expect("node applied");
}

async fn running_pod(client: &Client, ds: &str, node: &str) {
    let name = format!("{ds}-{node}");
    let body = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": ds},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": ds,
                "uid": "00000000-0000-4000-8000-000000000001", "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "example.invalid/x"}]}});
    let pods = Api::<Pod>::namespaced(client.clone(), NS);
    pods.patch(&name, &apply(), &Patch::Apply(body))
        .await
        .expect("pod applied");
    pods.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .expect("pod status written");
}

/// An operand DaemonSet (it schedules nothing here: no controller manager runs).
async fn daemonset(client: &Client, ds: &str, operand: &str) {
    let body = json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": ds, "namespace": NS},
        "spec": {"selector": {"matchLabels": {"app": ds}},
            "template": {"metadata": {"labels": {"app": ds}},
                "spec": {"nodeSelector": {format!("{P}{operand}"): "true"},
                    "containers": [{"name": "main", "image": "example.invalid/x"}]}}}});
    Api::<DaemonSet>::namespaced(client.clone(), NS)
        .patch(ds, &apply(), &Patch::Apply(body))
        .await
        .expect("daemonset applied");
}

async fn setup(client: &Client) {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}});
    Api::<Namespace>::all(client.clone())
        .patch(NS, &apply(), &Patch::Apply(ns))
        .await
        .expect("namespace");
    // Without a controller manager nobody creates the default service account.
    let sa = json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": NS}});
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .patch("default", &apply(), &Patch::Apply(sa))
        .await
        .expect("service account");
    daemonset(client, "nvidia-device-plugin-daemonset", "device-plugin").await;
    daemonset(
        client,
        "nvidia-container-toolkit-daemonset",
        "container-toolkit",
    )
    .await;
    node(client, N0, &["device-plugin", "container-toolkit"]).await;
    node(client, N1, &["device-plugin"]).await;
    running_pod(client, "nvidia-device-plugin-daemonset", N0).await;
    running_pod(client, "nvidia-container-toolkit-daemonset", N0).await;
    running_pod(client, "nvidia-device-plugin-daemonset", N1).await;
}

/// Removes what the test made, but the namespace: without a controller manager a deleted
/// namespace stays Terminating for good.
async fn cleanup(client: &Client) {
    let dp = DeleteParams::default();
    let _ = Api::<Node>::all(client.clone()).delete(N0, &dp).await;
    let _ = Api::<Node>::all(client.clone()).delete(N1, &dp).await;
    let lp = kube::api::ListParams::default();
    let _ = Api::<Pod>::namespaced(client.clone(), NS)
        .delete_collection(&dp, &lp)
        .await;
    let _ = Api::<DaemonSet>::namespaced(client.clone(), NS)
        .delete_collection(&dp, &lp)
        .await;
    let cp = Api::<DynamicObject>::all_with(client.clone(), &cluster_policy_resource());
    let _ = cp.delete("gdg-watch-test", &dp).await;
}

/// Waits until the metrics text satisfies `ok`, for at most 20 s.
async fn eventually(metrics: &Metrics, what: &str, ok: impl Fn(&str) -> bool) {
    for _ in 0..100 {
        if ok(&metrics.encode()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("not within 20 s: {what}\n{}", metrics.encode());
}

#[tokio::test]
#[ignore = "needs a throwaway cluster: GDG_TEST_KUBECONFIG=... cargo test --test watch_live -- --ignored"]
async fn the_watch_follows_the_cluster() {
    let client = client().await;
    cleanup(&client).await;
    setup(&client).await;

    let metrics = Arc::new(Metrics::new());
    let (facts_tx, mut facts_rx) = watch::channel(Arc::new(ClusterFacts::default()));
    let (ready_tx, ready_rx) = oneshot::channel();
    let mut config = WatchConfig::new(NS, Policy::default());
    config.debounce = Duration::from_millis(200);
    config.report = true;
    let task = tokio::spawn(watch_cluster(
        client.clone(),
        config,
        facts_tx,
        metrics.clone(),
        move || {
            let _ = ready_tx.send(());
        },
    ));
    tokio::time::timeout(Duration::from_secs(30), ready_rx)
        .await
        .expect("ready within the sync timeout")
        .expect("the gate is called");

    let series = |node: &str, what: &str, v: u8| {
        format!("gpu_deploy_guard_operand_{what}{{node=\"{node}\",operand=\"device-plugin\"}} {v}")
    };
    eventually(
        &metrics,
        "gdg-watch-1 runs the plugin without the toolkit",
        |m| {
            m.contains(&series(N1, "running", 1))
                && m.contains(&series(N0, "expected", 1))
                && m.contains("gpu_deploy_guard_audit_last_run_timestamp_seconds")
        },
    )
    .await;
    let text = metrics.encode();
    assert!(
        text.contains("gpu_deploy_guard_cluster_policy_available 0"),
        "no ClusterPolicy yet: {text}"
    );

    // The report was written through server-side apply, when its CRD is installed.
    let reports = Api::<DynamicObject>::all_with(client.clone(), &report_resource());
    match reports.get("gpu-deploy-guard").await {
        Ok(r) => {
            let results = r.data["results"].as_array().cloned().unwrap_or_default();
            assert!(
                results
                    .iter()
                    .any(|x| x["rule"] == "device-plugin-without-toolkit"
                        && x["result"] == "fail"
                        && x["resources"][0]["name"] == N1),
                "{results:?}"
            );
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!("clusterpolicyreports.wgpolicyk8s.io not installed: report not checked")
        }
        Err(e) => panic!("reading the report: {e}"),
    }

    // A ClusterPolicy with the toolkit off: the webhook's facts follow, the finding goes.
    let cp = Api::<DynamicObject>::all_with(client.clone(), &cluster_policy_resource());
    let body = json!({"apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "gdg-watch-test"}, "spec": {"toolkit": {"enabled": false}}});
    match cp
        .create(
            &PostParams::default(),
            &serde_json::from_value(body).unwrap(),
        )
        .await
    {
        Ok(_) => {
            tokio::time::timeout(
                Duration::from_secs(20),
                facts_rx.wait_for(|f| !f.toolkit_managed),
            )
            .await
            .expect("facts follow the ClusterPolicy within 20 s")
            .expect("the sender lives");
            eventually(&metrics, "the ClusterPolicy is read", |m| {
                m.contains("gpu_deploy_guard_cluster_policy_available 1")
            })
            .await;
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            eprintln!("clusterpolicies.nvidia.com not installed: ClusterPolicy not checked")
        }
        Err(e) => panic!("creating the ClusterPolicy: {e}"),
    }

    // A deleted node loses its series.
    Api::<Node>::all(client.clone())
        .delete(N1, &DeleteParams::default())
        .await
        .expect("node deleted");
    eventually(&metrics, "gdg-watch-1's series are gone", |m| {
        !m.contains(&format!("node=\"{N1}\"")) && m.contains(&series(N0, "running", 1))
    })
    .await;

    task.abort();
    cleanup(&client).await;
}
