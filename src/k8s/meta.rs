//! The one partial `metadata` every object view reads.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::IgnoredAny;

/// `name`, `namespace` and the identity fields, plus what `L` takes from `labels` and `O` from
/// `ownerReferences` (nothing by default); every other field is skipped unparsed.
/// `resourceVersion` must stay: kube's watcher resumes from it, and treats an event without one
/// as an error that forces a full re-list.
#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct PartialMeta<L = IgnoredAny, O = IgnoredAny> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    pub(crate) labels: L,
    #[serde(default)]
    pub(crate) owner_references: O,
}

impl<L, O> PartialMeta<L, O> {
    /// The name, namespace and identity fields as an `ObjectMeta`; labels and owners are left
    /// to the caller.
    pub(crate) fn into_parts(self) -> (ObjectMeta, L, O) {
        let meta = ObjectMeta {
            name: self.name,
            namespace: self.namespace,
            resource_version: self.resource_version,
            uid: self.uid,
            ..ObjectMeta::default()
        };
        (meta, self.labels, self.owner_references)
    }
}

/// One of `metadata.ownerReferences`, as far as it is read.
#[derive(Deserialize)]
pub(crate) struct RawOwner {
    #[serde(default)]
    pub(crate) kind: String,
    #[serde(default)]
    pub(crate) name: String,
    #[serde(default)]
    pub(crate) controller: Option<bool>,
}

/// A workload's `spec.template` (DaemonSet, Deployment), read only as far as `M` (the pod
/// template's metadata) and `P` (its pod spec) go; everything else is skipped.
#[derive(Default, serde::Deserialize)]
pub(crate) struct WorkloadSpec<M, P> {
    #[serde(default)]
    pub(crate) template: PodTemplate<M, P>,
}

#[derive(Default, serde::Deserialize)]
pub(crate) struct PodTemplate<M, P> {
    #[serde(default)]
    pub(crate) metadata: M,
    #[serde(default)]
    pub(crate) spec: P,
}
