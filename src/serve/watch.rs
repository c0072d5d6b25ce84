//! `serve`'s view of the cluster: reflectors on the ClusterPolicy, the
//! operator's DaemonSets and Deployments, and a compact record of every node,
//! so that no admission review costs an API call.
//!
//! Three tasks share it:
//! - the facts publisher: the [`ClusterFacts`] the webhook decides with
//!   (ClusterPolicy switches, real DaemonSet selectors, the operator version its
//!   Deployment's image tag names), re-computed at most once per debounce
//!   interval after a change and published on a `watch` channel; it also opens
//!   readiness;
//! - the node follower ([`super::nodes`]): a watch of whole Nodes (their taints are in `spec`;
//!   status and images are skipped unbuilt; pages of [`WatchConfig::page_size`]) kept as one
//!   [`NodeRecord`](crate::k8s::fleet::NodeRecord) per node with only the labels the
//!   decision reads and the taints; a heartbeat that changes none of them costs nothing more;
//! - the auditor ([`super::auditor`]), in the one replica holding the audit's
//!   Lease: it watches the operator's pods and keeps the continuous audit on
//!   `/metrics` (and, when asked, the ClusterPolicyReport) current, re-auditing
//!   only the nodes a change touched.
//!
//! Every kind is read through [`super::follow`]'s stream (retried within seconds, listed again
//! from scratch after a 403 or 404) and applied by its one watch driver, which records the
//! kind's health; the GPU-policy objects are kept as what the decisions read ([`super::kept`]),
//! and the stores the facts are made of are followed in `stores.rs`.
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

use kube::Client;
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};

use super::auditor;
use super::follow::health;
use super::health::{Health, Kind, Status};
use super::kept::Kept;
use super::lease::{Election, Leadership};
use super::nodes::follow_nodes;
use super::stores::{Healths, StoreWatches, Stores, current_facts};
use super::watch_config::WatchConfig;
use crate::audit::metrics::AuditMetrics;
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::version::Followed;
use crate::k8s::fleet::SharedFleet;
use crate::k8s::nvidia_driver;
use crate::metrics::Metrics;

/// Watches the cluster until the returned future is dropped.
///
/// `facts_tx` receives new [`ClusterFacts`] whenever they change. `on_synced` is called once,
/// after the ClusterPolicy, the DaemonSets and (unless a version is given) the Deployments have
/// been read (or found unavailable) and the facts published, or after `config.sync_timeout` at
/// the latest. The audit's metrics are registered in `metrics` on the way in; `leadership` says
/// when this replica audits.
pub async fn watch_cluster(
    client: Client,
    config: WatchConfig,
    facts_tx: watch::Sender<Arc<ClusterFacts>>,
    metrics: Arc<Metrics>,
    fleet: Arc<SharedFleet>,
    leadership: Leadership,
    on_synced: impl FnOnce() + Send + 'static,
) {
    let audit_metrics = AuditMetrics::register(&metrics, config.max_node_series);
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

    let (stores, writers) = Stores::new();
    let cfg = watcher::Config::default().any_semantic();
    let paged = cfg.clone().page_size(config.page_size);
    tokio::join!(
        StoreWatches {
            client: &client,
            namespace: &namespace,
            cfg,
            status: &status,
            dirty: &dirty_tx,
            watch_deployments,
        }
        .run(&stores, writers),
        follow_nodes(
            &client,
            paged.clone(),
            &fleet,
            facts_tx.subscribe(),
            &status,
            &namespace,
            &dirty_tx,
        ),
        Publisher {
            config: &config,
            stores: &stores,
            status: &status,
            facts_tx: &facts_tx,
            audit_metrics: &audit_metrics,
        }
        .run(dirty_rx, on_synced),
        auditor::run(auditor::Auditor {
            client: &client,
            config: &config,
            list: paged,
            fleet: &fleet,
            status: &status,
            facts: facts_tx.subscribe(),
            metrics: &audit_metrics,
            leadership,
        }),
    );
}

/// Takes part in the audit's election as `config` says: the Lease, or none.
pub fn elect(client: &Client, config: &WatchConfig) -> Election {
    match &config.lease {
        Some(lease) => Election::start(client.clone(), lease.clone()),
        None => Election::alone(),
    }
}

/// What the facts publisher reads and writes, besides its own state.
struct Publisher<'a> {
    config: &'a WatchConfig,
    stores: &'a Stores,
    status: &'a Mutex<Status>,
    facts_tx: &'a watch::Sender<Arc<ClusterFacts>>,
    audit_metrics: &'a AuditMetrics,
}

impl Publisher<'_> {
    /// After each burst of changes (debounced): publishes the facts and opens readiness once
    /// the ClusterPolicy and DaemonSets are read (or at the sync timeout).
    async fn run(self, mut dirty: mpsc::Receiver<()>, on_synced: impl FnOnce() + Send) {
        let deadline = Instant::now() + self.config.sync_timeout;
        let mut on_synced = Some(on_synced);
        let mut logged = Logged::default();
        loop {
            tokio::select! {
                received = dirty.recv() => if received.is_none() { return },
                () = sleep_until(deadline), if on_synced.is_some() => {}
            }
            sleep(self.config.debounce).await;
            while dirty.try_recv().is_ok() {}

            let status = self.status;
            let policies_health = health(status, Kind::ClusterPolicies);
            let drivers_health = health(status, Kind::NvidiaDrivers);
            let gpu_clusters_health = health(status, Kind::GpuClusters);
            let ds_health = health(status, Kind::DaemonSets);
            let deployments_health = health(status, Kind::Deployments);
            let slices_health = health(status, Kind::ResourceSlices);
            let plugins_health = health(status, Kind::ForeignPlugins);
            let mut facts = current_facts(
                self.stores,
                &Healths {
                    policies: &policies_health,
                    gpu_clusters: &gpu_clusters_health,
                    daemonsets: &ds_health,
                    deployments: &deployments_health,
                    slices: &slices_health,
                    plugins: &plugins_health,
                },
                self.config,
            );
            if drivers_health == Health::Synced {
                facts.nvidia_drivers = Some(nvidia_drivers(&self.stores.drivers));
            }
            self.publish(facts, &policies_health, &deployments_health, &mut logged);
            // Every kind a decision reads, the nodes included: a replica that took traffic
            // before its nodes were listed could only refuse the policy changes that need them.
            // A kind RBAC forbids is waited for too, up to the timeout.
            let kinds = [
                (Kind::ClusterPolicies, &policies_health),
                (Kind::NvidiaDrivers, &drivers_health),
                (Kind::GpuClusters, &gpu_clusters_health),
                (Kind::DaemonSets, &ds_health),
                (Kind::Deployments, &deployments_health),
                (Kind::ResourceSlices, &slices_health),
                (Kind::ForeignPlugins, &plugins_health),
                (Kind::Nodes, &health(status, Kind::Nodes)),
            ]
            .map(|(kind, health)| {
                self.audit_metrics
                    .set_watch_readable(kind.label(), *health == Health::Synced);
                (kind, health.ready_to_serve())
            });
            if let Some(f) = on_synced.take_if(|_| self.ready(&kinds, deadline)) {
                f();
            }
        }
    }

    /// Publishes `facts` when they changed, and says in the log where the switches and the
    /// operator version come from whenever that changes (once their kinds are settled).
    fn publish(
        &self,
        facts: ClusterFacts,
        policies_health: &Health,
        deployments_health: &Health,
        logged: &mut Logged,
    ) {
        let facts_changed = self.facts_tx.send_if_modified(|current| {
            if **current == facts {
                return false;
            }
            *current = Arc::new(facts.clone());
            true
        });
        if policies_health.settled()
            && (facts_changed || logged.source.as_ref() != Some(&facts.source))
        {
            log_source(&facts);
            self.audit_metrics
                .set_cluster_policy_available(matches!(facts.source, PolicySource::Found(_)));
            logged.source = Some(facts.source.clone());
        }
        let version = facts.operator.clone();
        if deployments_health.settled() && logged.version.as_ref() != Some(&version) {
            if facts.operator.source.assumed().is_some() {
                tracing::warn!("{}", facts.operator.describe());
            } else {
                tracing::info!(
                    era = facts.operator.era().name(),
                    "{}",
                    facts.operator.describe()
                );
            }
            logged.version = Some(version);
        }
    }

    /// Whether readiness opens now (called while it is not open yet): every kind settled, or
    /// the sync timeout passed, which the log says with what is missing.
    fn ready(&self, kinds: &[(Kind, bool)], deadline: Instant) -> bool {
        let settled = kinds.iter().all(|(_, settled)| *settled);
        if !settled && Instant::now() < deadline {
            return false;
        }
        if !settled {
            let missing: Vec<String> = kinds
                .iter()
                .filter(|(_, settled)| !settled)
                .map(|(kind, _)| kind.describe(&self.config.namespace))
                .collect();
            tracing::warn!(
                timeout = ?self.config.sync_timeout,
                missing = %missing.join(", "),
                "not everything the decisions read was listed in time; ready with what is known, and the decisions that need what is missing refuse what could break nodes"
            );
        }
        true
    }
}

/// What the publisher last said in the log: where the switches came from, and the operator
/// version.
#[derive(Default)]
struct Logged {
    source: Option<PolicySource>,
    version: Option<Followed>,
}

/// The NVIDIADriver resources the store holds, by name; one that cannot be read (the CRD's
/// schema makes that rare) is left out with a warning naming it.
fn nvidia_drivers(store: &Kept) -> Vec<NvidiaDriver> {
    let mut out: Vec<NvidiaDriver> = store
        .values()
        .iter()
        .filter_map(|value| match nvidia_driver::from_object(value) {
            Ok(d) => Some(d),
            Err(e) => {
                tracing::warn!(error = %e, "NVIDIADriver left out of GPU-policy decisions");
                None
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
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
    use crate::core::policy::Policy;

    /// `serve` spawns the watch on the runtime, so its future must be `Send`. Compiling this
    /// function is the test.
    #[allow(dead_code)]
    fn the_watch_can_be_spawned(client: Client, tx: watch::Sender<Arc<ClusterFacts>>) {
        fn spawnable<F: std::future::Future<Output = ()> + Send + 'static>(_: F) {}
        let config = WatchConfig::new("gpu-operator", Policy::default());
        let (_leader_tx, leadership) = Leadership::always();
        spawnable(watch_cluster(
            client,
            config,
            tx,
            Arc::new(Metrics::new()),
            Arc::new(SharedFleet::default()),
            leadership,
            || {},
        ));
    }
}
