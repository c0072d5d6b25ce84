//! `serve`'s view of the cluster: reflectors on the ClusterPolicy, the
//! operator's DaemonSets, pods and Deployments, and the nodes, so that no
//! admission review costs an API call.
//!
//! From them it keeps two things current, re-computed at most once per
//! debounce interval after a change:
//! - the [`ClusterFacts`] the webhook decides with (ClusterPolicy switches,
//!   real DaemonSet selectors, the operator version its Deployment's image tag
//!   names), published on a `watch` channel;
//! - the continuous audit on `/metrics` (and, when asked, the
//!   ClusterPolicyReport).
//!
//! A missing ClusterPolicy CRD (404) or missing RBAC (403) is not an error:
//! the operator's defaults are used, the log says so once,
//! `gpu_deploy_guard_cluster_policy_available` is 0 and the audit reports it.
//! Should the CRD or the permission appear later, the watch picks it up. The
//! same holds for the Deployments: unreadable, the operator version is assumed
//! (the newest era) with the reason in the facts. A version given by
//! `--operator-version` or the config file is followed instead, and the
//! Deployments are then not watched at all.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::{Stream, StreamExt};
use kube::api::{Api, DynamicObject};
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, reflector as reflect};
use kube::{Client, Resource};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};

use crate::audit;
use crate::audit::apply::apply_report;
use crate::audit::metrics::AuditMetrics;
use crate::audit::report::{self, PolicyReport};
use crate::core::facts::{ClusterFacts, PolicySource, VersionSource};
use crate::core::operator::OperatorVersion;
use crate::core::policy::Policy;
use crate::k8s::api::{
    cluster_from, cluster_policy_resource, missing_or_forbidden, unavailable_source,
};
use crate::k8s::daemonset::DaemonSetView;
use crate::k8s::deployment::{self, DeploymentView, Unread};
use crate::k8s::node::NodeView;
use crate::k8s::pod::PodView;
use crate::metrics::Metrics;

/// What the watch needs to know.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    /// The GPU Operator's namespace: its DaemonSets and pods are watched there.
    pub namespace: String,
    /// Rule actions, for the audit's findings.
    pub policy: Policy,
    /// Quiet time after a change before facts and audit are re-computed.
    pub debounce: Duration,
    /// Longest wait for the first sync of the ClusterPolicy and DaemonSets before the
    /// readiness gate opens anyway (with the facts known by then, and a warning).
    pub sync_timeout: Duration,
    /// Write the audit as ClusterPolicyReport `gpu-deploy-guard` whenever its findings change.
    pub report: bool,
    /// The operator version given (flag or config file), and how; `None`: read it from the
    /// operator's Deployment.
    pub operator_version: Option<(OperatorVersion, VersionSource)>,
}

impl WatchConfig {
    pub fn new(namespace: impl Into<String>, policy: Policy) -> Self {
        WatchConfig {
            namespace: namespace.into(),
            policy,
            debounce: Duration::from_secs(1),
            sync_timeout: Duration::from_secs(30),
            report: false,
            operator_version: None,
        }
    }
}

/// How one watched kind is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Health {
    /// Not listed yet.
    #[default]
    Starting,
    /// Listed; the store is complete.
    Synced,
    /// Cannot be listed for good (404: no such resource; 403: RBAC), until that changes.
    Unavailable(Unavailable),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Unavailable {
    NotFound,
    Forbidden,
}

impl Health {
    /// Synced, or known to be unavailable: there is nothing more to wait for.
    fn settled(&self) -> bool {
        !matches!(self, Health::Starting)
    }
}

#[derive(Default)]
struct Status {
    policies: Health,
    daemonsets: Health,
    pods: Health,
    nodes: Health,
    deployments: Health,
}

#[derive(Copy, Clone)]
enum Kind {
    ClusterPolicies,
    DaemonSets,
    Pods,
    Nodes,
    Deployments,
}

impl Kind {
    fn health(self, status: &mut Status) -> &mut Health {
        match self {
            Kind::ClusterPolicies => &mut status.policies,
            Kind::DaemonSets => &mut status.daemonsets,
            Kind::Pods => &mut status.pods,
            Kind::Nodes => &mut status.nodes,
            Kind::Deployments => &mut status.deployments,
        }
    }

    fn describe(self, namespace: &str) -> String {
        match self {
            Kind::ClusterPolicies => "clusterpolicies.nvidia.com".to_owned(),
            Kind::DaemonSets => format!("daemonsets in namespace {namespace}"),
            Kind::Pods => format!("pods in namespace {namespace}"),
            Kind::Nodes => "nodes".to_owned(),
            Kind::Deployments => format!("deployments in namespace {namespace}"),
        }
    }
}

/// A 404 or 403 from a list or watch: the resource or the permission is missing.
fn unavailable(error: &watcher::Error) -> Option<Unavailable> {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.as_ref(),
        watcher::Error::WatchError(s) => s.as_ref(),
        _ => return None,
    };
    match missing_or_forbidden(status)? {
        403 => Some(Unavailable::Forbidden),
        _ => Some(Unavailable::NotFound),
    }
}

/// Watches the cluster until the returned future is dropped.
///
/// `facts_tx` receives new [`ClusterFacts`] whenever they change. `on_synced` is called once,
/// after the ClusterPolicy, the DaemonSets and (unless a version is given) the Deployments have
/// been read (or found unavailable) and the facts published, or after `config.sync_timeout` at
/// the latest. The audit's metrics are
/// registered in `metrics` on the way in.
pub async fn watch_cluster(
    client: Client,
    config: WatchConfig,
    facts_tx: watch::Sender<Arc<ClusterFacts>>,
    metrics: Arc<Metrics>,
    on_synced: impl FnOnce() + Send + 'static,
) {
    let audit_metrics = AuditMetrics::register(&metrics);
    let namespace = config.namespace.clone();
    // With a version given, the Deployments are not watched: nothing to wait for.
    let watch_deployments = config.operator_version.is_none();
    let status = Mutex::new(Status {
        deployments: if watch_deployments {
            Health::Starting
        } else {
            Health::Synced
        },
        ..Status::default()
    });
    let (dirty_tx, dirty_rx) = mpsc::channel::<()>(1);

    let policy_ar = cluster_policy_resource();
    let policy_writer = Writer::<DynamicObject>::new(policy_ar.clone());
    let policies = policy_writer.as_reader();
    let (daemonsets, ds_writer) = reflector::store::<DaemonSetView>();
    let (pods, pod_writer) = reflector::store::<PodView>();
    let (nodes, node_writer) = reflector::store::<NodeView>();
    let (deployments, deployment_writer) = reflector::store::<DeploymentView>();
    let cfg = watcher::Config::default().any_semantic();

    let stores = Stores {
        policies,
        daemonsets,
        pods,
        nodes,
        deployments,
    };
    tokio::join!(
        follow(
            watcher(Api::all_with(client.clone(), &policy_ar), cfg.clone()),
            policy_writer,
            Kind::ClusterPolicies,
            &namespace,
            &status,
            &dirty_tx,
        ),
        follow(
            watcher(Api::namespaced(client.clone(), &namespace), cfg.clone()),
            ds_writer,
            Kind::DaemonSets,
            &namespace,
            &status,
            &dirty_tx,
        ),
        follow(
            watcher(Api::namespaced(client.clone(), &namespace), cfg.clone()),
            pod_writer,
            Kind::Pods,
            &namespace,
            &status,
            &dirty_tx,
        ),
        follow(
            watcher(Api::all(client.clone()), cfg.clone()),
            node_writer,
            Kind::Nodes,
            &namespace,
            &status,
            &dirty_tx,
        ),
        async {
            if watch_deployments {
                follow(
                    watcher(Api::namespaced(client.clone(), &namespace), cfg),
                    deployment_writer,
                    Kind::Deployments,
                    &namespace,
                    &status,
                    &dirty_tx,
                )
                .await;
            }
        },
        Refresh {
            client: &client,
            config: &config,
            stores: &stores,
            status: &status,
            facts_tx: &facts_tx,
            audit_metrics: &audit_metrics,
        }
        .run(dirty_rx, on_synced),
    );
}

fn watcher<K>(
    api: Api<K>,
    cfg: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    watcher::watcher(api, cfg).default_backoff()
}

struct Stores {
    policies: Store<DynamicObject>,
    daemonsets: Store<DaemonSetView>,
    pods: Store<PodView>,
    nodes: Store<NodeView>,
    deployments: Store<DeploymentView>,
}

/// Feeds one reflector and records how its watch is doing; every change marks the state dirty.
async fn follow<K>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    writer: Writer<K>,
    kind: Kind,
    namespace: &str,
    status: &Mutex<Status>,
    dirty: &mpsc::Sender<()>,
) where
    K: reflector::Lookup + Clone,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let stream = reflect(writer, stream);
    futures::pin_mut!(stream);
    let mut failing = false;
    while let Some(item) = stream.next().await {
        let changed = match item {
            Ok(Event::InitDone) => {
                let was = set_health(status, kind, Health::Synced);
                if let Health::Unavailable(_) = was {
                    tracing::info!(what = %kind.describe(namespace), "now readable");
                }
                failing = false;
                true
            }
            Ok(Event::Apply(_) | Event::Delete(_)) => true,
            Ok(Event::Init | Event::InitApply(_)) => false,
            Err(e) => match unavailable(&e) {
                Some(why) => {
                    let was = set_health(status, kind, Health::Unavailable(why));
                    if was != Health::Unavailable(why) {
                        let what = kind.describe(namespace);
                        match why {
                            Unavailable::NotFound => {
                                tracing::warn!(%what, "not found (is the CRD installed?); retrying in the background")
                            }
                            Unavailable::Forbidden => {
                                tracing::warn!(%what, "forbidden by RBAC; retrying in the background")
                            }
                        }
                    }
                    was != Health::Unavailable(why)
                }
                None => {
                    // Passing trouble (a dropped connection, an expired resourceVersion): the
                    // watcher recovers by itself; say so once per bout.
                    if !failing {
                        tracing::warn!(what = %kind.describe(namespace), error = %e, "watch interrupted; retrying");
                        failing = true;
                    }
                    false
                }
            },
        };
        if changed {
            let _ = dirty.try_send(());
        }
    }
}

fn set_health(status: &Mutex<Status>, kind: Kind, health: Health) -> Health {
    let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
    std::mem::replace(kind.health(&mut s), health)
}

/// What the refresh loop reads and writes, besides its own state.
struct Refresh<'a> {
    client: &'a Client,
    config: &'a WatchConfig,
    stores: &'a Stores,
    status: &'a Mutex<Status>,
    facts_tx: &'a watch::Sender<Arc<ClusterFacts>>,
    audit_metrics: &'a AuditMetrics,
}

impl Refresh<'_> {
    /// After each burst of changes (debounced): publishes the facts, opens readiness once the
    /// ClusterPolicy and DaemonSets are read (or at the sync timeout), and audits.
    async fn run(self, mut dirty: mpsc::Receiver<()>, on_synced: impl FnOnce() + Send) {
        let Refresh {
            client,
            config,
            stores,
            status,
            facts_tx,
            audit_metrics,
        } = self;
        let deadline = Instant::now() + config.sync_timeout;
        let mut on_synced = Some(on_synced);
        let mut logged_source: Option<PolicySource> = None;
        let mut logged_version: Option<(OperatorVersion, VersionSource)> = None;
        let mut audit_paused_logged = false;
        let mut last_report: Option<PolicyReport> = None;
        let mut report_failing = false;
        loop {
            tokio::select! {
                received = dirty.recv() => if received.is_none() { return },
                () = sleep_until(deadline), if on_synced.is_some() => {}
            }
            sleep(config.debounce).await;
            while dirty.try_recv().is_ok() {}

            let (policies_health, ds_health, pods_health, nodes_health, deployments_health) = {
                let s = status.lock().unwrap_or_else(|e| e.into_inner());
                (
                    s.policies.clone(),
                    s.daemonsets.clone(),
                    s.pods.clone(),
                    s.nodes.clone(),
                    s.deployments.clone(),
                )
            };
            let facts = current_facts(
                stores,
                &policies_health,
                &ds_health,
                &deployments_health,
                config,
            );
            let facts_changed = facts_tx.send_if_modified(|current| {
                if **current == facts {
                    return false;
                }
                *current = Arc::new(facts.clone());
                true
            });
            if policies_health.settled()
                && (facts_changed || logged_source.as_ref() != Some(&facts.source))
            {
                log_source(&facts);
                audit_metrics
                    .set_cluster_policy_available(matches!(facts.source, PolicySource::Found(_)));
                logged_source = Some(facts.source.clone());
            }
            let version = (facts.version.clone(), facts.version_source.clone());
            if deployments_health.settled() && logged_version.as_ref() != Some(&version) {
                if facts.version_source.assumed().is_some() {
                    tracing::warn!("{}", facts.version_described());
                } else {
                    tracing::info!(
                        era = facts.version.era.name(),
                        "{}",
                        facts.version_described()
                    );
                }
                logged_version = Some(version);
            }
            let settled =
                policies_health.settled() && ds_health.settled() && deployments_health.settled();
            if on_synced.is_some() && (settled || Instant::now() >= deadline) {
                if !settled {
                    tracing::warn!(
                        timeout = ?config.sync_timeout,
                        "ClusterPolicy, DaemonSets and the operator Deployment not read in time; ready with what is known for now"
                    );
                }
                if let Some(f) = on_synced.take() {
                    f();
                }
            }

            if pods_health != Health::Synced || nodes_health != Health::Synced {
                let unavailable = matches!(pods_health, Health::Unavailable(_))
                    || matches!(nodes_health, Health::Unavailable(_));
                if unavailable && !audit_paused_logged {
                    tracing::warn!(
                        "continuous audit paused: nodes or operator pods cannot be listed"
                    );
                    audit_paused_logged = true;
                }
                continue;
            }
            audit_paused_logged = false;
            let nodes = stores.nodes.state();
            let pods = stores.pods.state();
            let result = audit::audit(&nodes, &pods, &facts, &config.policy);
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default();
            let seconds = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
            audit_metrics.record(&result, seconds);
            tracing::debug!(
                nodes = result.nodes.len(),
                ok = result.nodes.iter().filter(|n| n.is_ok()).count(),
                "audit"
            );
            if config.report {
                let built = report::build(&result, report::Timestamp { seconds, nanos: 0 });
                let comparable = built.without_timestamps();
                if last_report.as_ref() == Some(&comparable) {
                    continue;
                }
                match apply_report(client, &built).await {
                    Ok(()) => {
                        if report_failing {
                            tracing::info!("ClusterPolicyReport written again");
                        }
                        report_failing = false;
                        last_report = Some(comparable);
                    }
                    Err(e) => {
                        if !report_failing {
                            tracing::warn!(error = %e, "cannot write the ClusterPolicyReport; retrying on the next change");
                        }
                        report_failing = true;
                    }
                }
            }
        }
    }
}

/// The facts the stores give now; the operator version is the given one, else the one the
/// Deployments show.
fn current_facts(
    stores: &Stores,
    policies: &Health,
    daemonsets: &Health,
    deployments: &Health,
    config: &WatchConfig,
) -> ClusterFacts {
    let objects: Vec<Value> = stores
        .policies
        .state()
        .iter()
        .map(|o| serde_json::to_value(o.as_ref()).unwrap_or_default())
        .collect();
    let policies = match policies {
        Health::Synced => Ok(objects.as_slice()),
        Health::Starting => Err(PolicySource::Failed("not read yet".to_owned())),
        Health::Unavailable(Unavailable::NotFound) => Err(unavailable_source(404)),
        Health::Unavailable(Unavailable::Forbidden) => Err(unavailable_source(403)),
    };
    let ds_state = stores.daemonsets.state();
    let ds_refs: Vec<&DaemonSetView> = ds_state.iter().map(AsRef::as_ref).collect();
    let daemonsets = (*daemonsets == Health::Synced).then_some(ds_refs.as_slice());
    let mut facts = cluster_from(policies, daemonsets);
    (facts.version, facts.version_source) = match &config.operator_version {
        Some((version, source)) => (version.clone(), source.clone()),
        None => {
            let state = stores.deployments.state();
            let refs: Vec<&DeploymentView> = state.iter().map(AsRef::as_ref).collect();
            let listed = match deployments {
                Health::Synced => Ok(refs.as_slice()),
                Health::Starting => Err(&Unread::NotYet),
                Health::Unavailable(Unavailable::NotFound) => Err(&Unread::NotFound),
                Health::Unavailable(Unavailable::Forbidden) => Err(&Unread::Forbidden),
            };
            deployment::operator_version(&config.namespace, listed)
        }
    };
    facts
}

fn log_source(facts: &ClusterFacts) {
    let source = &facts.source;
    if source.is_unavailable() {
        tracing::warn!(state = source.state(), "{}", source.describe());
    } else {
        let disabled: Vec<&str> = facts.disabled.iter().map(|op| op.name()).collect();
        tracing::info!(
            toolkit_managed = facts.toolkit_managed,
            disabled = %disabled.join(","),
            custom_selectors = facts.selectors.len(),
            "{}",
            source.describe()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::Status as ApiStatus;

    fn api(code: u16, reason: &str) -> kube::Error {
        kube::Error::Api(Box::new(ApiStatus {
            code,
            reason: reason.to_owned(),
            ..ApiStatus::default()
        }))
    }

    /// `serve` spawns the watch on the runtime, so its future must be `Send`. Compiling this
    /// function is the test.
    #[allow(dead_code)]
    fn the_watch_can_be_spawned(client: Client, tx: watch::Sender<Arc<ClusterFacts>>) {
        fn spawnable<F: std::future::Future<Output = ()> + Send + 'static>(_: F) {}
        let config = WatchConfig::new("gpu-operator", Policy::default());
        spawnable(watch_cluster(
            client,
            config,
            tx,
            Arc::new(Metrics::new()),
            || {},
        ));
    }

    #[test]
    fn not_found_and_forbidden_are_unavailable_other_errors_pass() {
        assert_eq!(
            unavailable(&watcher::Error::InitialListFailed(api(404, "NotFound"))),
            Some(Unavailable::NotFound)
        );
        assert_eq!(
            unavailable(&watcher::Error::WatchStartFailed(api(403, "Forbidden"))),
            Some(Unavailable::Forbidden)
        );
        assert_eq!(
            unavailable(&watcher::Error::InitialListFailed(api(
                500,
                "InternalError"
            ))),
            None
        );
        assert_eq!(unavailable(&watcher::Error::NoResourceVersion), None);
        assert_eq!(
            unavailable(&watcher::Error::InitialListFailed(api(
                404,
                "Failed to parse error data"
            ))),
            Some(Unavailable::NotFound),
            "a resource without a CRD answers in plain text"
        );
    }

    fn empty_stores() -> Stores {
        Stores {
            policies: Writer::<DynamicObject>::new(cluster_policy_resource()).as_reader(),
            daemonsets: reflector::store::<DaemonSetView>().0,
            pods: reflector::store::<PodView>().0,
            nodes: reflector::store::<NodeView>().0,
            deployments: reflector::store::<DeploymentView>().0,
        }
    }

    #[test]
    fn nothing_listed_yet_means_defaults_and_no_daemonset_knowledge() {
        let stores = empty_stores();
        let config = WatchConfig::new("gpu-operator", Policy::default());
        let c = current_facts(
            &stores,
            &Health::Starting,
            &Health::Starting,
            &Health::Starting,
            &config,
        );
        let switches = ClusterFacts {
            source: PolicySource::NotGiven,
            version: crate::core::facts::operator_defaults().version,
            version_source: crate::core::facts::operator_defaults().version_source,
            ..c.clone()
        };
        assert_eq!(switches, crate::core::facts::operator_defaults());
        assert_eq!(c.daemonsets, None);
        assert_eq!(
            c.version_source.assumed(),
            Some("deployments in namespace gpu-operator not read yet")
        );
        let c = current_facts(
            &stores,
            &Health::Unavailable(Unavailable::Forbidden),
            &Health::Synced,
            &Health::Synced,
            &config,
        );
        assert_eq!(c.source.state(), "forbidden");
        assert_eq!(c.daemonsets.map(|d| d.is_empty()), Some(true));
    }

    fn operator_deployment(image: &str) -> DeploymentView {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-operator", "namespace": "gpu-operator", "resourceVersion": "1"},
            "spec": {"template": {"metadata": {"labels": {"app": "gpu-operator"}},
                "spec": {"containers": [{"name": "gpu-operator", "image": image}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn the_version_follows_the_operator_deployment_unless_one_is_given() {
        let (reader, mut writer) = reflector::store::<DeploymentView>();
        writer.apply_watcher_event(&Event::Apply(operator_deployment(
            "nvcr.io/nvidia/gpu-operator:v24.9.2",
        )));
        let stores = Stores {
            deployments: reader,
            ..empty_stores()
        };
        let mut config = WatchConfig::new("gpu-operator", Policy::default());
        let facts = |config: &WatchConfig, deployments: Health| {
            current_facts(
                &stores,
                &Health::Synced,
                &Health::Synced,
                &deployments,
                config,
            )
        };
        let c = facts(&config, Health::Synced);
        assert_eq!(c.version.era, crate::core::operator::Era::V24_9);
        assert_eq!(
            c.annotation(),
            "ClusterPolicy unavailable (no ClusterPolicy object exists): the GPU Operator's \
             default operand switches are assumed; GPU Operator v24.9.2 read from Deployment \
             gpu-operator/gpu-operator"
        );
        // RBAC forbids the Deployments: the newest era, assumed, and why.
        let c = facts(&config, Health::Unavailable(Unavailable::Forbidden));
        assert_eq!(c.version.era, crate::core::operator::Era::NEWEST);
        assert!(c.version_source.assumed().is_some());
        assert_eq!(
            c.version_described(),
            "GPU Operator v26.7 assumed (deployments in namespace gpu-operator are forbidden)"
        );
        // A given version wins over the Deployment's.
        config.operator_version = Some((
            OperatorVersion::parse("v26.3.0").unwrap(),
            VersionSource::Given("--operator-version".into()),
        ));
        let c = facts(&config, Health::Synced);
        assert_eq!(c.version.era, crate::core::operator::Era::V26_3);
        assert_eq!(
            c.version_described(),
            "GPU Operator v26.3.0 given by --operator-version"
        );
    }
}
