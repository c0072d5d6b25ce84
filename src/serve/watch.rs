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
//! - the node follower ([`super::nodes`]): a metadata-only watch of the nodes (no spec, status or
//!   images on the wire, pages of [`WatchConfig::page_size`]) kept as one
//!   [`NodeRecord`](crate::k8s::fleet::NodeRecord) per node with only the labels the
//!   decision reads; a heartbeat that changes none of them costs nothing more;
//! - the auditor ([`super::auditor`]), in the one replica holding the audit's
//!   Lease: it watches the operator's pods and keeps the continuous audit on
//!   `/metrics` (and, when asked, the ClusterPolicyReport) current, re-auditing
//!   only the nodes a change touched.
//!
//! Every kind is read through [`super::follow`]'s stream (retried within seconds, listed again
//! from scratch after a 403 or 404); the GPU-policy objects are kept as what the decisions read
//! ([`super::kept`]).
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
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, sleep, sleep_until};

use super::auditor;
use super::follow::{Following, POLICY_PAGE_SIZE, follow, health, watcher as stream};
use super::health::{Health, Kind, Status, Unavailable};
use super::kept::{self, Kept};
use super::lease::{Election, Leadership};
use super::nodes::follow_nodes;
use super::watch_config::WatchConfig;
use crate::audit::metrics::AuditMetrics;
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::nvidia_driver::NvidiaDriver;
use crate::core::version::{self, Followed};
use crate::k8s::api::{cluster_from, cluster_policy_resource, unavailable_source};
use crate::k8s::daemonset::DaemonSetView;
use crate::k8s::deployment::{self, DeploymentView, Unread};
use crate::k8s::fleet::Fleet;
use crate::k8s::gpu_cluster;
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
    fleet: Arc<Fleet>,
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

    let (daemonsets, ds_writer) = reflector::store::<DaemonSetView>();
    let (deployments, deployment_writer) = reflector::store::<DeploymentView>();
    let cfg = watcher::Config::default().any_semantic();
    let paged = cfg.clone().page_size(config.page_size);
    // A GPU-policy object can be as large as the API server lets it (1.5 MB): a few per page,
    // so one page's body stays small whatever they hold.
    let policy_pages = cfg.clone().page_size(POLICY_PAGE_SIZE);

    let stores = Stores {
        policies: Kept::default(),
        drivers: Kept::default(),
        gpu_clusters: Kept::default(),
        daemonsets,
        deployments,
    };
    let kept = |resource: &kube::api::ApiResource, kept, bounds, kind| Following {
        api: Api::all_with(client.clone(), resource),
        cfg: policy_pages.clone(),
        kept,
        bounds,
        kind,
        namespace: &namespace,
        status: &status,
        dirty: &dirty_tx,
    };
    tokio::join!(
        kept(
            &cluster_policy_resource(),
            &stores.policies,
            kept::POLICIES,
            Kind::ClusterPolicies
        )
        .run(),
        kept(
            &nvidia_driver::resource(),
            &stores.drivers,
            kept::DRIVERS,
            Kind::NvidiaDrivers
        )
        .run(),
        kept(
            &gpu_cluster::resource(),
            &stores.gpu_clusters,
            kept::GPU_CLUSTERS,
            Kind::GpuClusters
        )
        .run(),
        follow(
            stream(Api::namespaced(client.clone(), &namespace), cfg.clone()),
            ds_writer,
            Kind::DaemonSets,
            &namespace,
            &status,
            &dirty_tx,
        ),
        async {
            if watch_deployments {
                follow(
                    stream(Api::namespaced(client.clone(), &namespace), cfg.clone()),
                    deployment_writer,
                    Kind::Deployments,
                    &namespace,
                    &status,
                    &dirty_tx,
                )
                .await;
            }
        },
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

struct Stores {
    policies: Kept,
    drivers: Kept,
    gpu_clusters: Kept,
    daemonsets: Store<DaemonSetView>,
    deployments: Store<DeploymentView>,
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
        let Publisher {
            config,
            stores,
            status,
            facts_tx,
            audit_metrics,
        } = self;
        let deadline = Instant::now() + config.sync_timeout;
        let mut on_synced = Some(on_synced);
        let mut logged_source: Option<PolicySource> = None;
        let mut logged_version: Option<Followed> = None;
        loop {
            tokio::select! {
                received = dirty.recv() => if received.is_none() { return },
                () = sleep_until(deadline), if on_synced.is_some() => {}
            }
            sleep(config.debounce).await;
            while dirty.try_recv().is_ok() {}

            let policies_health = health(status, Kind::ClusterPolicies);
            let drivers_health = health(status, Kind::NvidiaDrivers);
            let gpu_clusters_health = health(status, Kind::GpuClusters);
            let ds_health = health(status, Kind::DaemonSets);
            let deployments_health = health(status, Kind::Deployments);
            let mut facts = current_facts(
                stores,
                &Healths {
                    policies: &policies_health,
                    gpu_clusters: &gpu_clusters_health,
                    daemonsets: &ds_health,
                    deployments: &deployments_health,
                },
                config,
            );
            if drivers_health == Health::Synced {
                facts.nvidia_drivers = Some(nvidia_drivers(&stores.drivers));
            }
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
            let version = facts.operator.clone();
            if deployments_health.settled() && logged_version.as_ref() != Some(&version) {
                if facts.operator.source.assumed().is_some() {
                    tracing::warn!("{}", facts.operator.describe());
                } else {
                    tracing::info!(
                        era = facts.operator.era().name(),
                        "{}",
                        facts.operator.describe()
                    );
                }
                logged_version = Some(version);
            }
            // Every kind a decision reads, the nodes included: a replica that took traffic
            // before its nodes were listed could only refuse the policy changes that need them.
            // A kind RBAC forbids is waited for too, up to the timeout.
            let kinds = [
                (Kind::ClusterPolicies, &policies_health),
                (Kind::NvidiaDrivers, &drivers_health),
                (Kind::GpuClusters, &gpu_clusters_health),
                (Kind::DaemonSets, &ds_health),
                (Kind::Deployments, &deployments_health),
                (Kind::Nodes, &health(status, Kind::Nodes)),
            ]
            .map(|(kind, health)| {
                audit_metrics.set_watch_readable(kind.label(), *health == Health::Synced);
                (kind, health.ready_to_serve())
            });
            let settled = kinds.iter().all(|(_, settled)| *settled);
            if on_synced.is_some() && (settled || Instant::now() >= deadline) {
                if !settled {
                    let missing: Vec<String> = kinds
                        .iter()
                        .filter(|(_, settled)| !settled)
                        .map(|(kind, _)| kind.describe(&config.namespace))
                        .collect();
                    tracing::warn!(
                        timeout = ?config.sync_timeout,
                        missing = %missing.join(", "),
                        "not everything the decisions read was listed in time; ready with what is known, and the decisions that need what is missing refuse what could break nodes"
                    );
                }
                if let Some(f) = on_synced.take() {
                    f();
                }
            }
        }
    }
}

/// How the watched kinds that make the facts are doing.
#[derive(Copy, Clone)]
struct Healths<'a> {
    policies: &'a Health,
    gpu_clusters: &'a Health,
    daemonsets: &'a Health,
    deployments: &'a Health,
}

/// The facts the stores give now; the operator version is the given one, else the one the
/// Deployments show.
fn current_facts(stores: &Stores, healths: &Healths<'_>, config: &WatchConfig) -> ClusterFacts {
    let Healths {
        policies,
        gpu_clusters,
        daemonsets,
        deployments,
    } = *healths;
    let gpu_clusters_health = gpu_clusters;
    let objects = stores.policies.values();
    let policies = match policies {
        Health::Synced => Ok(objects.as_slice()),
        Health::Starting => Err(PolicySource::Failed("not read yet".to_owned())),
        Health::Unavailable(Unavailable::NotFound) => Err(unavailable_source(404)),
        Health::Unavailable(Unavailable::Forbidden) => Err(unavailable_source(403)),
        Health::Unavailable(Unavailable::TooMany) => Err(PolicySource::Failed(format!(
            "more ClusterPolicies than the guard keeps ({})",
            kept::POLICIES.objects
        ))),
    };
    let ds_state = stores.daemonsets.state();
    let ds_refs: Vec<&DaemonSetView> = ds_state.iter().map(AsRef::as_ref).collect();
    let daemonsets = (*daemonsets == Health::Synced).then_some(ds_refs.as_slice());
    // The GPUClusters count once listed; unavailable (no CRD before v26.7, no RBAC) is none.
    let gpu_cluster_objects = stores.gpu_clusters.values();
    let gpu_clusters = (*gpu_clusters == Health::Synced).then_some(gpu_cluster_objects.as_slice());
    let mut facts = cluster_from(policies, gpu_clusters, daemonsets);
    facts.gpu_clusters_unknown = match gpu_clusters_health {
        Health::Synced | Health::Unavailable(Unavailable::NotFound) => None,
        Health::Starting => Some("gpuclusters.nvidia.com are not listed yet".to_owned()),
        Health::Unavailable(Unavailable::Forbidden) => {
            Some("RBAC forbids listing gpuclusters.nvidia.com".to_owned())
        }
        Health::Unavailable(Unavailable::TooMany) => Some(format!(
            "more GPUClusters than the guard keeps ({})",
            kept::GPU_CLUSTERS.objects
        )),
    };
    let state = stores.deployments.state();
    let refs: Vec<&DeploymentView> = state.iter().map(AsRef::as_ref).collect();
    let listed = match deployments {
        Health::Synced => Ok(refs.as_slice()),
        Health::Starting => Err(&Unread::NotYet),
        Health::Unavailable(Unavailable::NotFound) => Err(&Unread::NotFound),
        Health::Unavailable(Unavailable::Forbidden) => Err(&Unread::Forbidden),
        // Not a bound of the Deployments.
        Health::Unavailable(Unavailable::TooMany) => Err(&Unread::NotYet),
    };
    facts.operator = version::resolve(
        config.operator_version.clone(),
        deployment::operator_version(&config.namespace, listed),
    );
    facts
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
    use crate::core::operator::OperatorVersion;
    use crate::core::policy::Policy;
    use crate::core::version::VersionSource;
    use crate::k8s::policy_object::PolicyObject;
    use kube::runtime::watcher::Event;

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
            Arc::new(Fleet::default()),
            leadership,
            || {},
        ));
    }

    /// The healths of the ClusterPolicies, DaemonSets and Deployments; GPUClusters unavailable.
    fn healths<'a>(
        policies: &'a Health,
        daemonsets: &'a Health,
        deployments: &'a Health,
    ) -> Healths<'a> {
        const NO_GPU_CLUSTERS: Health = Health::Unavailable(Unavailable::NotFound);
        Healths {
            policies,
            gpu_clusters: &NO_GPU_CLUSTERS,
            daemonsets,
            deployments,
        }
    }

    /// A listed GPUCluster, and no ClusterPolicy CRD: the DRA stack, which the facts say.
    #[test]
    fn a_listed_gpu_cluster_makes_the_dra_stack() {
        let object: PolicyObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
            "metadata": {"name": "gpu-cluster"},
            "spec": {"dcgmExporter": {"enabled": true}}
        }))
        .unwrap();
        let stores = empty_stores();
        stores
            .gpu_clusters
            .apply(&Event::Apply(object), kept::GPU_CLUSTERS);
        let config = WatchConfig::new("gpu-operator", Policy::default());
        let missing = Health::Unavailable(Unavailable::NotFound);
        let listed = |gpu_clusters: &Health| {
            current_facts(
                &stores,
                &Healths {
                    gpu_clusters,
                    ..healths(&missing, &Health::Synced, &Health::Synced)
                },
                &config,
            )
        };
        let c = listed(&Health::Synced);
        assert_eq!(c.stack, crate::core::operands::Stack::GpuCluster);
        assert_eq!(c.source, PolicySource::GpuCluster("gpu-cluster".to_owned()));
        assert!(
            c.annotation().ends_with("; GPUCluster (DRA) stack"),
            "{}",
            c.annotation()
        );
        // Not listed yet: the stack is not known to be the DRA one.
        let c = listed(&Health::Starting);
        assert_eq!(c.stack, crate::core::operands::Stack::ClusterPolicy);
    }

    fn empty_stores() -> Stores {
        Stores {
            policies: Kept::default(),
            drivers: Kept::default(),
            gpu_clusters: Kept::default(),
            daemonsets: reflector::store::<DaemonSetView>().0,
            deployments: reflector::store::<DeploymentView>().0,
        }
    }

    #[test]
    fn nothing_listed_yet_means_defaults_and_no_daemonset_knowledge() {
        let stores = empty_stores();
        let config = WatchConfig::new("gpu-operator", Policy::default());
        let c = current_facts(
            &stores,
            &healths(&Health::Starting, &Health::Starting, &Health::Starting),
            &config,
        );
        let switches = ClusterFacts {
            source: PolicySource::NotGiven,
            operator: crate::core::facts::operator_defaults().operator,
            ..c.clone()
        };
        assert_eq!(switches, crate::core::facts::operator_defaults());
        assert_eq!(c.daemonsets, None);
        assert_eq!(
            c.operator.source.assumed(),
            Some("deployments in namespace gpu-operator not read yet")
        );
        let c = current_facts(
            &stores,
            &healths(
                &Health::Unavailable(Unavailable::Forbidden),
                &Health::Synced,
                &Health::Synced,
            ),
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
                &healths(&Health::Synced, &Health::Synced, &deployments),
                config,
            )
        };
        let c = facts(&config, Health::Synced);
        assert_eq!(c.operator.era(), crate::core::operands::Era::V24_9);
        assert_eq!(
            c.annotation(),
            "ClusterPolicy unavailable (no ClusterPolicy object exists): the GPU Operator's \
             default operand switches are assumed; GPU Operator v24.9.2 read from Deployment \
             gpu-operator/gpu-operator"
        );
        // RBAC forbids the Deployments: the newest era, assumed, and why.
        let c = facts(&config, Health::Unavailable(Unavailable::Forbidden));
        assert_eq!(c.operator.era(), crate::core::operands::Era::NEWEST);
        assert!(c.operator.source.assumed().is_some());
        assert_eq!(
            c.operator.describe(),
            "GPU Operator v26.7 assumed (deployments in namespace gpu-operator are forbidden)"
        );
        // A given version wins over the Deployment's.
        config.operator_version = Some(Followed {
            version: OperatorVersion::parse("v26.3.0").unwrap(),
            source: VersionSource::Given("--operator-version".into()),
        });
        let c = facts(&config, Health::Synced);
        assert_eq!(c.operator.era(), crate::core::operands::Era::V26_3);
        assert_eq!(
            c.operator.describe(),
            "GPU Operator v26.3.0 given by --operator-version"
        );
    }
}
