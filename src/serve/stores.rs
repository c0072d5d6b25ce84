//! The stores the facts are made of (the kept GPU-policy objects, the DaemonSets and the
//! Deployments), the watches that follow them, and the [`ClusterFacts`] they give.

use std::sync::Mutex;

use kube::Client;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::watcher;
use tokio::sync::mpsc;

use super::follow::{Following, POLICY_PAGE_SIZE, follow, watcher as stream};
use super::health::{Health, Kind, Status, Unavailable};
use super::kept::{self, Kept};
use super::plugins::{Plugins, follow_plugins, lock as lock_plugins};
use super::slices::follow_slices;
use super::watch_config::WatchConfig;
use crate::core::dra::{DraNodes, SliceIndex};
use crate::core::facts::{ClusterFacts, PolicySource};
use crate::core::foreign::ForeignPlugins;
use crate::core::seen::Seen;
use crate::core::version;
use crate::k8s::api::{cluster_from, cluster_policy_resource, unavailable_source};
use crate::k8s::daemonset::DaemonSetView;
use crate::k8s::deployment::{self, DeploymentView, Unread};
use crate::k8s::gpu_cluster;
use crate::k8s::nvidia_driver;
use std::sync::Arc;

pub(super) struct Stores {
    pub(super) policies: Kept,
    pub(super) drivers: Kept,
    pub(super) gpu_clusters: Kept,
    pub(super) daemonsets: Store<DaemonSetView>,
    pub(super) deployments: Store<DeploymentView>,
    /// The ResourceSlices of NVIDIA's GPU DRA driver, by name, with their nodes.
    pub(super) slices: Mutex<SliceIndex>,
    /// The device-plugin DaemonSets outside the operator's namespace.
    pub(super) plugins: Mutex<Plugins>,
}

/// The writers of the reflector stores.
pub(super) struct Writers {
    daemonsets: Writer<DaemonSetView>,
    deployments: Writer<DeploymentView>,
}

impl Stores {
    /// Empty stores, and the writers that fill the reflector ones.
    pub(super) fn new() -> (Stores, Writers) {
        let (daemonsets, ds_writer) = reflector::store::<DaemonSetView>();
        let (deployments, deployment_writer) = reflector::store::<DeploymentView>();
        let stores = Stores {
            policies: Kept::default(),
            drivers: Kept::default(),
            gpu_clusters: Kept::default(),
            daemonsets,
            deployments,
            slices: Mutex::default(),
            plugins: Mutex::default(),
        };
        let writers = Writers {
            daemonsets: ds_writer,
            deployments: deployment_writer,
        };
        (stores, writers)
    }
}

/// What the stores' watches share.
pub(super) struct StoreWatches<'a> {
    pub(super) client: &'a Client,
    pub(super) namespace: &'a str,
    /// List and watch settings of the DaemonSets and Deployments.
    pub(super) cfg: watcher::Config,
    pub(super) status: &'a Mutex<Status>,
    pub(super) dirty: &'a mpsc::Sender<()>,
    /// False when a version is given: the Deployments are then not watched.
    pub(super) watch_deployments: bool,
}

impl StoreWatches<'_> {
    /// Follows every kind the facts are made of into `stores` until the watch ends.
    pub(super) async fn run(self, stores: &Stores, writers: Writers) {
        let StoreWatches {
            client,
            namespace,
            cfg,
            status,
            dirty,
            watch_deployments,
        } = self;
        // A GPU-policy object can be as large as the API server lets it (1.5 MB): a few per
        // page, so one page's body stays small whatever they hold.
        let policy_pages = cfg.clone().page_size(POLICY_PAGE_SIZE);
        let kept = |resource: &kube::api::ApiResource, kept, bounds, kind| Following {
            api: Api::all_with(client.clone(), resource),
            cfg: policy_pages.clone(),
            kept,
            bounds,
            kind,
            namespace,
            status,
            dirty,
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
                stream(Api::namespaced(client.clone(), namespace), cfg.clone()),
                writers.daemonsets,
                Kind::DaemonSets,
                namespace,
                status,
                dirty,
            ),
            follow_slices(client, &cfg, &stores.slices, status, dirty),
            follow_plugins(client, &cfg, namespace, &stores.plugins, status, dirty),
            async {
                if watch_deployments {
                    follow(
                        stream(Api::namespaced(client.clone(), namespace), cfg.clone()),
                        writers.deployments,
                        Kind::Deployments,
                        namespace,
                        status,
                        dirty,
                    )
                    .await;
                }
            },
        );
    }
}

/// How the watched kinds that make the facts are doing.
#[derive(Copy, Clone)]
pub(super) struct Healths<'a> {
    pub(super) policies: &'a Health,
    pub(super) gpu_clusters: &'a Health,
    pub(super) daemonsets: &'a Health,
    pub(super) deployments: &'a Health,
    pub(super) slices: &'a Health,
    pub(super) plugins: &'a Health,
}

/// The facts the stores give now; the operator version is the given one, else the one the
/// Deployments show.
pub(super) fn current_facts(
    stores: &Stores,
    healths: &Healths<'_>,
    config: &WatchConfig,
) -> ClusterFacts {
    let Healths {
        policies,
        gpu_clusters,
        daemonsets,
        deployments,
        slices,
        plugins,
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
    facts.dra_nodes = dra_nodes(&stores.slices, slices);
    facts.foreign_plugins = foreign_plugins(&stores.plugins, plugins, &config.namespace);
    facts
}

/// The nodes with a ResourceSlice of NVIDIA's GPU DRA driver, or why that is not known. A
/// cluster that serves no `resource.k8s.io` group has none.
fn dra_nodes(kept: &Mutex<SliceIndex>, health: &Health) -> DraNodes {
    let what = Kind::ResourceSlices.describe("");
    seen(health, &what, super::slices::MAX_SLICES, || {
        kept.lock().unwrap_or_else(|e| e.into_inner()).node_set()
    })
}

/// The device-plugin DaemonSets outside the operator's namespace, or why they are not known.
fn foreign_plugins(kept: &Mutex<Plugins>, health: &Health, namespace: &str) -> ForeignPlugins {
    let what = format!("device-plugin daemonsets.apps outside {namespace}");
    seen(health, &what, super::plugins::MAX_FOREIGN_PLUGINS, || {
        lock_plugins(kept).values().cloned().collect()
    })
}

/// What a bounded watched kind shows, by its health: `known()` once listed, nothing where the
/// cluster does not serve it, and why not otherwise.
fn seen<T: Default>(
    health: &Health,
    what: &str,
    bound: usize,
    known: impl FnOnce() -> T,
) -> Seen<T> {
    match health {
        Health::Synced => Seen::Known(Arc::new(known())),
        Health::Unavailable(Unavailable::NotFound) => Seen::Known(Arc::default()),
        Health::Starting => Seen::Unknown(format!("{what} are not listed yet")),
        Health::Unavailable(Unavailable::Forbidden) => {
            Seen::Unknown(format!("RBAC forbids listing {what}"))
        }
        Health::Unavailable(Unavailable::TooMany) => {
            Seen::Unknown(format!("more {what} than the guard keeps ({bound})"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operator::OperatorVersion;
    use crate::core::policy::Policy;
    use crate::core::version::{Followed, VersionSource};
    use crate::k8s::policy_object::PolicyObject;
    use kube::runtime::watcher::Event;

    /// The healths of the ClusterPolicies, DaemonSets and Deployments; GPUClusters unavailable.
    fn healths<'a>(
        policies: &'a Health,
        daemonsets: &'a Health,
        deployments: &'a Health,
    ) -> Healths<'a> {
        const NO_GPU_CLUSTERS: Health = Health::Unavailable(Unavailable::NotFound);
        const NO_SLICES: Health = Health::Unavailable(Unavailable::NotFound);
        const NO_PLUGINS: Health = Health::Unavailable(Unavailable::NotFound);
        Healths {
            policies,
            gpu_clusters: &NO_GPU_CLUSTERS,
            daemonsets,
            deployments,
            slices: &NO_SLICES,
            plugins: &NO_PLUGINS,
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
            slices: Mutex::default(),
            plugins: Mutex::default(),
        }
    }

    /// The slices' health decides what the rule may read: known nodes once listed, none where
    /// the cluster does not serve it, and why not otherwise.
    #[test]
    fn the_dra_nodes_follow_the_slices_health() {
        use crate::core::dra::SliceRef;
        let kept = Mutex::new(SliceIndex::default());
        kept.lock().unwrap().apply(SliceRef {
            name: "s",
            driver: "gpu.nvidia.com",
            node: Some("gpu-1"),
        });
        assert_eq!(dra_nodes(&kept, &Health::Synced).has("gpu-1"), Some(true));
        assert_eq!(
            dra_nodes(&kept, &Health::Unavailable(Unavailable::NotFound)).has("gpu-1"),
            Some(false)
        );
        for (health, why) in [
            (
                Health::Starting,
                "resourceslices.resource.k8s.io of driver gpu.nvidia.com are not listed yet",
            ),
            (
                Health::Unavailable(Unavailable::Forbidden),
                "RBAC forbids listing resourceslices.resource.k8s.io of driver gpu.nvidia.com",
            ),
            (
                Health::Unavailable(Unavailable::TooMany),
                "more resourceslices.resource.k8s.io of driver gpu.nvidia.com than the guard keeps (20000)",
            ),
        ] {
            assert_eq!(dra_nodes(&kept, &health), DraNodes::Unknown(why.to_owned()));
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
        // The healths give no slices (no resource.k8s.io served): none is known.
        assert_eq!(c.dra_nodes, DraNodes::Known(Default::default()));
        let switches = ClusterFacts {
            source: PolicySource::NotGiven,
            operator: crate::core::facts::operator_defaults().operator,
            dra_nodes: DraNodes::NotRead,
            foreign_plugins: ForeignPlugins::NotRead,
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
