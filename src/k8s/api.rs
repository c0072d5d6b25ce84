//! The API: the audit's snapshot of a live cluster (the nodes, as metadata, and the
//! operator's pods in pages; one call each for its DaemonSets, the ClusterPolicies and the
//! Deployments in its namespace), how a
//! missing CRD or RBAC shows, what the ClusterPolicies, DaemonSets and the operator's
//! Deployment say, and writing an object with server-side apply.

use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Client, Error as KubeError};
use serde_json::Value;

use super::cluster_policy;
use super::daemonset::{DaemonSetView, learn_daemonsets};
use super::deployment::{self, DeploymentView, Unread};
use super::fleet::LabelFilter;
use super::foreign::{self, AnyDaemonSetView};
use super::gpu_cluster;
use super::node::NodeView;
use super::nvidia_driver;
use super::pod::PodView;
use super::resource_slice::{self, ResourceSliceView};
use crate::core::dra::{self, DraNodes};
use crate::core::facts::{ClusterFacts, PolicySource, gpu_cluster_switched_off, operator_defaults};
use crate::core::foreign::ForeignPlugins;
use crate::core::seen::Seen;

/// The field manager of every write, and so the owner of the report's fields.
pub const FIELD_MANAGER: &str = "gpu-deploy-guard";

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("cannot connect to the cluster (kubeconfig or in-cluster service account): {0}")]
    Connect(#[source] KubeError),
    #[error("cannot list {what}: {}", brief(.source))]
    List {
        what: String,
        #[source]
        source: KubeError,
    },
    #[error("cannot write {what}: {}", brief(.source))]
    Write {
        what: String,
        #[source]
        source: KubeError,
    },
}

/// The API server's own sentence for an API error (kube's Display adds the whole Status).
pub fn brief(error: &KubeError) -> String {
    match error {
        KubeError::Api(s) if !s.message.is_empty() => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// `nvidia.com/v1` ClusterPolicy, cluster-scoped.
pub fn cluster_policy_resource() -> ApiResource {
    ApiResource {
        group: "nvidia.com".into(),
        version: "v1".into(),
        api_version: "nvidia.com/v1".into(),
        kind: "ClusterPolicy".into(),
        plural: "clusterpolicies".into(),
    }
}

/// A 404 or 403 answer. For a resource whose CRD is not installed the API server answers
/// `404 page not found` in plain text, not a Status, so the code decides, not the reason.
pub fn missing_or_forbidden(status: &kube::core::Status) -> Option<u16> {
    match status.code {
        404 | 403 => Some(status.code),
        _ if status.is_not_found() => Some(404),
        _ if status.is_forbidden() => Some(403),
        _ => None,
    }
}

/// Why the ClusterPolicy is unreadable, for a 404 (CRD missing) or a 403 (RBAC).
pub fn unavailable_source(code: u16) -> PolicySource {
    if code == 403 {
        PolicySource::Forbidden("RBAC forbids listing clusterpolicies.nvidia.com".to_owned())
    } else {
        PolicySource::Missing(
            "the ClusterPolicy CRD (clusterpolicies.nvidia.com) is not installed".to_owned(),
        )
    }
}

/// Why the ClusterPolicy cannot be read, for a 404 (no CRD) or 403 (RBAC); `None` for other
/// errors, which may pass.
pub fn policy_unavailable(error: &KubeError) -> Option<PolicySource> {
    match error {
        KubeError::Api(s) => missing_or_forbidden(s).map(unavailable_source),
        _ => None,
    }
}

/// The facts the ClusterPolicies (as listed) and the DaemonSets (when listed) give.
pub fn cluster_from(
    policies: Result<&[Value], PolicySource>,
    gpu_clusters: Option<&[Value]>,
    daemonsets: Option<&[&DaemonSetView]>,
) -> ClusterFacts {
    let policy_exists = matches!(policies, Ok(list) if !list.is_empty());
    let mut next_policy = None;
    let (mut facts, source) = match policies {
        Ok(list) => {
            // The one the operator follows, then the one it follows once that is deleted.
            let turn = cluster_policy::in_turn(list);
            match turn.first().map(|p| cluster_policy::from_object(p)) {
                Some(Ok(p)) => {
                    // Unreadable, there is no next one to judge a hand-over by.
                    next_policy = turn
                        .get(1)
                        .and_then(|next| cluster_policy::from_object(next).ok())
                        .map(|next| Box::new((next.name, next.facts)));
                    (p.facts, PolicySource::Found(p.name))
                }
                Some(Err(e)) => (operator_defaults(), PolicySource::Failed(e.to_string())),
                None => (
                    operator_defaults(),
                    PolicySource::Missing("no ClusterPolicy object exists".to_owned()),
                ),
            }
        }
        Err(source) => (operator_defaults(), source),
    };
    facts.source = source;
    facts.next_policy = next_policy;
    if let Some(gc) = gpu_clusters.and_then(gpu_cluster::first) {
        facts = match gc {
            Ok(gc) => facts.with_gpu_cluster(&gc.name, gc.disabled, gc.tolerations, policy_exists),
            Err(e) => {
                // The stack is known even when the switches are not: the defaults of an empty
                // spec, and the source says why.
                let Ok(defaults) =
                    gpu_cluster_switched_off(|_, _| Ok::<_, std::convert::Infallible>(None));
                let mut f =
                    facts.with_gpu_cluster("(unreadable)", defaults, Vec::new(), policy_exists);
                if !policy_exists {
                    f.source = PolicySource::Failed(e.to_string());
                }
                f
            }
        };
    }
    if let Some(ds) = daemonsets {
        learn_daemonsets(&mut facts, ds.iter().copied());
    }
    facts
}

/// Every object of a cluster-scoped custom resource, as JSON; `None` when they cannot be
/// listed (no CRD, no RBAC, another error): such a resource counts as absent.
async fn list_objects(client: &Client, resource: &ApiResource) -> Option<Vec<Value>> {
    let list = Api::<DynamicObject>::all_with(client.clone(), resource)
        .list(&ListParams::default())
        .await
        .ok()?;
    Some(
        list.items
            .iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect(),
    )
}

/// The nodes NVIDIA's GPU DRA driver publishes ResourceSlices for, listed (at the version the
/// cluster serves) in pages narrowed to its driver by a field selector, and what of the slices
/// was not read. A cluster that serves no `resource.k8s.io` has none; RBAC that forbids the list
/// leaves them unknown.
pub async fn dra_nodes(client: &Client) -> (DraNodes, Vec<String>) {
    let ar = match resource_slice::served(client).await {
        Ok(Some(ar)) => ar,
        Ok(None) => return (DraNodes::Known(Default::default()), Vec::new()),
        Err(e) => {
            let why = format!("discovering resource.k8s.io failed: {}", brief(&e));
            return (DraNodes::Unknown(why.clone()), vec![why]);
        }
    };
    let api = Api::<ResourceSliceView>::all_with(client.clone(), &ar);
    let params = ListParams::default()
        .fields(&resource_slice::field_selector())
        .limit(SNAPSHOT_PAGE);
    let mut slices = Vec::new();
    match list_pages_with(&api, params, |s| slices.push(s)).await {
        Ok(()) => dra::read_all(slices.iter().map(ResourceSliceView::as_ref)),
        Err(e) => {
            let why = match &e {
                KubeError::Api(s) => match missing_or_forbidden(s) {
                    Some(404) => return (DraNodes::Known(Default::default()), Vec::new()),
                    Some(_) => "RBAC forbids listing resourceslices.resource.k8s.io".to_owned(),
                    None => format!(
                        "listing resourceslices.resource.k8s.io failed: {}",
                        brief(&e)
                    ),
                },
                _ => format!(
                    "listing resourceslices.resource.k8s.io failed: {}",
                    brief(&e)
                ),
            };
            (DraNodes::Unknown(why.clone()), vec![why])
        }
    }
}

/// The DaemonSets outside the operator's namespace that run the NVIDIA device plugin, from a
/// paged list of every DaemonSet (read only for that).
pub async fn foreign_plugins(client: &Client, namespace: &str) -> ForeignPlugins {
    let api = Api::<AnyDaemonSetView>::all(client.clone());
    let mut all = Vec::new();
    let params = ListParams::default().limit(SNAPSHOT_PAGE);
    match list_pages_with(&api, params, |d| {
        if d.plugin.is_some() {
            all.push(d);
        }
    })
    .await
    {
        Ok(()) => Seen::Known(std::sync::Arc::new(foreign::foreign_plugins(
            &all, namespace,
        ))),
        Err(KubeError::Api(s)) if missing_or_forbidden(&s) == Some(403) => {
            Seen::Unknown("RBAC forbids listing daemonsets.apps in every namespace".to_owned())
        }
        Err(e) => Seen::Unknown(format!("listing daemonsets.apps failed: {}", brief(&e))),
    }
}

/// Everything one audit of a live cluster reads.
pub struct Snapshot {
    pub nodes: Vec<NodeView>,
    pub pods: Vec<PodView>,
    pub facts: ClusterFacts,
    /// What was read and not used, or could not be read, in sentences (the ResourceSlices).
    pub notes: Vec<String>,
}

/// Connects with the kubeconfig (or the in-cluster service account).
pub async fn connect() -> Result<Client, ClusterError> {
    Client::try_default().await.map_err(ClusterError::Connect)
}

/// Why the Deployments could not be listed: 403, 404 or another error. Unlike the other
/// lists, a failure here only leaves the operator version assumed.
pub fn deployments_unread(error: &KubeError) -> Unread {
    match error {
        KubeError::Api(s) => match missing_or_forbidden(s) {
            Some(403) => Unread::Forbidden,
            Some(_) => Unread::NotFound,
            None => Unread::Failed(brief(error)),
        },
        other => Unread::Failed(brief(other)),
    }
}

/// Objects per page of the snapshot's pod lists: one page is held whole while it is
/// read, so the lists' memory stays bounded whatever the size of the fleet.
pub const SNAPSHOT_PAGE: u32 = 250;

/// Lists every object of `api` in pages of `page`, handing each to `each` as it arrives.
async fn list_pages<K>(api: &Api<K>, page: u32, each: impl FnMut(K)) -> Result<(), KubeError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    list_pages_with(api, ListParams::default().limit(page), each).await
}

/// [`list_pages`] with the caller's list parameters (a label selector, the page size).
pub async fn list_pages_with<K>(
    api: &Api<K>,
    mut params: ListParams,
    mut each: impl FnMut(K),
) -> Result<(), KubeError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    loop {
        let list = api.list(&params).await?;
        let next = list.metadata.continue_.clone().filter(|c| !c.is_empty());
        list.items.into_iter().for_each(&mut each);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(()),
        }
    }
}

/// Lists what the audit needs. The ClusterPolicies, DaemonSets and Deployments come first:
/// the facts they give say which node labels the decision reads, and each node keeps only
/// those ([`LabelFilter`]: the labels decisions read, the DaemonSets' and NVIDIADrivers'
/// selector keys) as its page arrives. Nodes are listed whole (their taints are in `spec`) in
/// pages of [`NODE_PAGE_SIZE`](crate::k8s::node::NODE_PAGE_SIZE), pods in pages of
/// [`SNAPSHOT_PAGE`].
pub async fn snapshot(client: &Client, namespace: &str) -> Result<Snapshot, ClusterError> {
    snapshot_keeping(client, namespace, &[]).await
}

/// [`snapshot`], the nodes keeping the labels `extra` names too (the keys a GPU-policy change
/// being previewed selects on).
pub async fn snapshot_keeping(
    client: &Client,
    namespace: &str,
    extra: &[String],
) -> Result<Snapshot, ClusterError> {
    let list = |what: &str| {
        let what = what.to_owned();
        move |source| ClusterError::List { what, source }
    };
    let params = ListParams::default();
    let daemonsets = Api::<DaemonSetView>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .map_err(list(&format!("daemonsets in namespace {namespace}")))?
        .items;
    let ar = cluster_policy_resource();
    let policies = match Api::<DynamicObject>::all_with(client.clone(), &ar)
        .list(&params)
        .await
    {
        Ok(list) => Ok(list
            .items
            .iter()
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect::<Vec<Value>>()),
        Err(e) => Err(policy_unavailable(&e).unwrap_or_else(|| PolicySource::Failed(brief(&e)))),
    };
    let deployments = Api::<DeploymentView>::namespaced(client.clone(), namespace)
        .list(&params)
        .await
        .map(|list| list.items)
        .map_err(|e| deployments_unread(&e));
    // The GPUClusters (v26.7+): unreadable (no CRD, no RBAC) means none.
    let gpu_clusters = list_objects(client, &gpu_cluster::resource()).await;
    let ds_refs: Vec<&DaemonSetView> = daemonsets.iter().collect();
    let mut facts = cluster_from(
        policies.as_deref().map_err(Clone::clone),
        gpu_clusters.as_deref(),
        Some(&ds_refs),
    );
    let deployment_refs: Result<Vec<&DeploymentView>, &Unread> =
        deployments.as_ref().map(|list| list.iter().collect());
    facts.operator =
        deployment::operator_version(namespace, deployment_refs.as_deref().map_err(|e| *e));

    // The NVIDIADriver resources: unreadable (no CRD, no RBAC) is not an error here.
    facts.nvidia_drivers = list_objects(client, &nvidia_driver::resource())
        .await
        .map(|objects| {
            objects
                .iter()
                .filter_map(|o| nvidia_driver::from_object(o).ok())
                .collect()
        });

    let (dra_nodes, mut notes) = dra_nodes(client).await;
    facts.dra_nodes = dra_nodes;
    facts.foreign_plugins = foreign_plugins(client, namespace).await;
    if let Seen::Unknown(why) = &facts.foreign_plugins {
        notes.push(format!(
            "device-plugin DaemonSets outside {namespace} are not judged: {why}"
        ));
    }

    let filter = LabelFilter::new(&facts);
    let mut nodes = Vec::new();
    list_pages(
        &Api::<NodeView>::all(client.clone()),
        crate::k8s::node::NODE_PAGE_SIZE,
        |mut node| {
            if let Some(labels) = &mut node.metadata.labels {
                labels.retain(|k, _| filter.keeps(k) || extra.contains(k));
            }
            nodes.push(node);
        },
    )
    .await
    .map_err(list("nodes"))?;
    let mut pods = Vec::new();
    list_pages(
        &Api::<PodView>::namespaced(client.clone(), namespace),
        SNAPSHOT_PAGE,
        |pod| pods.push(pod),
    )
    .await
    .map_err(list(&format!("pods in namespace {namespace}")))?;
    Ok(Snapshot {
        nodes,
        pods,
        facts,
        notes,
    })
}

/// Writes `body` with server-side apply, forcing: its fields belong to gpu-deploy-guard.
/// `what` names the object in the error. A body with `metadata.resourceVersion` (see
/// [`Fence::version`]) is written only if the object is still at that resourceVersion (409
/// Conflict otherwise). The body is serialized as it is, and only the object's metadata comes
/// back (a report of thousands of results is not parsed again). Returns the resourceVersion
/// written.
pub async fn apply<T: serde::Serialize + std::fmt::Debug>(
    client: &Client,
    resource: &ApiResource,
    name: &str,
    body: &T,
    what: &str,
) -> Result<Option<String>, ClusterError> {
    let api = Api::<DynamicObject>::all_with(client.clone(), resource);
    api.patch_metadata(
        name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(body),
    )
    .await
    .map(|object| object.metadata.resource_version)
    .map_err(|source| ClusterError::Write {
        what: what.to_owned(),
        source,
    })
}

/// The precondition of a write: what the writer last knew of the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fence {
    /// Write whatever is there: the writer does not care, or the object did not exist when
    /// read (server-side apply cannot require an object to be absent, so a first write has no
    /// precondition; every later one has).
    Any,
    /// The object was at this resourceVersion (409 Conflict if it moved).
    At(String),
}

impl Fence {
    /// The resourceVersion a write under this fence carries in its metadata.
    pub fn version(&self) -> Option<&str> {
        match self {
            Fence::Any => None,
            Fence::At(version) => Some(version),
        }
    }

    /// The fence of an object as just read.
    pub async fn read(
        client: &Client,
        resource: &ApiResource,
        name: &str,
        what: &str,
    ) -> Result<Fence, ClusterError> {
        let api = Api::<DynamicObject>::all_with(client.clone(), resource);
        match api.get_metadata_opt(name).await {
            Ok(object) => Ok(object
                .and_then(|o| o.metadata.resource_version)
                .map_or(Fence::Any, Fence::At)),
            Err(source) => Err(ClusterError::List {
                what: what.to_owned(),
                source,
            }),
        }
    }
}

/// Whether a write failed on its fence: the object changed (or appeared) since it was read.
pub fn fence_broken(error: &ClusterError) -> bool {
    matches!(error, ClusterError::Write { source: KubeError::Api(status), .. } if status.code == 409)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::Operand;
    use kube::core::Status;

    #[test]
    fn not_found_and_forbidden_fall_back_to_the_defaults() {
        let status = |code: u16, reason: &str| {
            KubeError::Api(Box::new(Status {
                code,
                reason: reason.to_owned(),
                ..Status::default()
            }))
        };
        assert_eq!(
            policy_unavailable(&status(404, "NotFound")).map(|s| s.state()),
            Some("missing")
        );
        assert_eq!(
            policy_unavailable(&status(403, "Forbidden")).map(|s| s.state()),
            Some("forbidden")
        );
        assert_eq!(policy_unavailable(&status(500, "InternalError")), None);
        // What kube makes of the plain-text answer for a resource without a CRD.
        assert_eq!(
            policy_unavailable(&status(404, "Failed to parse error data")).map(|s| s.state()),
            Some("missing")
        );
        assert_eq!(
            deployments_unread(&status(403, "Forbidden")),
            Unread::Forbidden
        );
        assert_eq!(
            deployments_unread(&status(404, "NotFound")),
            Unread::NotFound
        );
        assert!(matches!(
            deployments_unread(&status(500, "InternalError")),
            Unread::Failed(_)
        ));
    }

    #[test]
    fn the_cluster_combines_policy_and_daemonsets() {
        let cp = serde_json::json!({"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy",
            "metadata":{"name":"cluster-policy"},"spec":{"toolkit":{"enabled":false}}});
        let ds: DaemonSetView = serde_json::from_value(
            serde_json::json!({"metadata":{"name":"gpu-feature-discovery"},
            "spec":{"template":{"spec":{"nodeSelector":{"pool":"a"}}}}}),
        )
        .unwrap();
        let c = cluster_from(Ok(&[cp]), None, Some(&[&ds]));
        assert_eq!(c.source, PolicySource::Found("cluster-policy".into()));
        assert!(!c.toolkit_managed);
        assert!(c.selectors.contains_key(&Operand::GpuFeatureDiscovery));
        assert_eq!(
            c.daemonsets.map(|d| d.iter().collect::<Vec<_>>()),
            Some(vec![Operand::GpuFeatureDiscovery])
        );
        let none = cluster_from(Ok(&[]), None, None);
        assert_eq!(none.source.state(), "missing");
        let switches = ClusterFacts {
            source: PolicySource::NotGiven,
            ..none.clone()
        };
        assert_eq!(switches, operator_defaults());
        assert_eq!(none.daemonsets, None);
    }

    /// A GPUCluster without a ClusterPolicy is the DRA stack with its own switches; with one,
    /// the operator reconciles neither; one that does not read still names the stack.
    #[test]
    fn a_gpu_cluster_decides_the_stack() {
        use crate::core::operands::Stack;
        let gc = serde_json::json!({"apiVersion":"nvidia.com/v1alpha1","kind":"GPUCluster",
            "metadata":{"name":"gpu-cluster"},"spec":{"dcgmExporter":{"enabled":true}}});
        let cp = serde_json::json!({"apiVersion":"nvidia.com/v1","kind":"ClusterPolicy",
            "metadata":{"name":"cluster-policy"},"spec":{}});
        let missing = Err(PolicySource::Missing("no CRD".into()));
        let dra = cluster_from(missing.clone(), Some(std::slice::from_ref(&gc)), None);
        assert_eq!(dra.stack, Stack::GpuCluster);
        assert_eq!(dra.source, PolicySource::GpuCluster("gpu-cluster".into()));
        assert!(dra.driver_crd);
        assert_eq!(
            dra.disabled.iter().collect::<Vec<_>>(),
            [Operand::DcgmDra],
            "no standalone DCGM unless switched on"
        );
        let empty = cluster_from(Ok(&[]), Some(std::slice::from_ref(&gc)), None);
        assert_eq!(empty.stack, Stack::GpuCluster);
        let both = cluster_from(Ok(&[cp]), Some(std::slice::from_ref(&gc)), None);
        assert_eq!(both.stack, Stack::Both);
        assert_eq!(both.source, PolicySource::Found("cluster-policy".into()));
        let bad = serde_json::json!({"kind":"GPUCluster","metadata":{"name":"gpu-cluster"},
            "spec":{"dcgm":{"enabled":"yes"}}});
        let unread = cluster_from(missing, Some(&[bad]), None);
        assert_eq!(unread.stack, Stack::GpuCluster);
        assert!(
            matches!(&unread.source, PolicySource::Failed(why) if why.contains("spec.dcgm.enabled")),
            "{:?}",
            unread.source
        );
        let none = cluster_from(Ok(&[]), Some(&[]), None);
        assert_eq!(none.stack, Stack::ClusterPolicy);
    }
}
