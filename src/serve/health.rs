//! How each watched kind is doing ([`Health`], kept per [`Kind`] in a [`Status`]): what
//! readiness waits for, and what the decisions say when a kind cannot be read.

use kube::runtime::watcher;

use crate::k8s::api::missing_or_forbidden;

/// How one watched kind is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) enum Health {
    /// Not listed yet.
    #[default]
    Starting,
    /// Listed; the store is complete.
    Synced,
    /// Cannot be listed for good (404: no such resource; 403: RBAC), until that changes.
    Unavailable(Unavailable),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Unavailable {
    NotFound,
    Forbidden,
    /// More objects (or larger) than the guard keeps of the kind ([`super::kept`]).
    TooMany,
}

impl Health {
    /// Synced, or known to be unavailable: there is nothing more to wait for.
    pub(super) fn settled(&self) -> bool {
        !matches!(self, Health::Starting)
    }

    /// Nothing to wait for before taking traffic: listed, or unavailable in a way waiting does
    /// not change (no such resource, or more than the guard keeps). A kind RBAC forbids is
    /// waited for, up to the sync timeout: a chart's RBAC often lands just after its
    /// Deployment, and a replica ready before it can only refuse what needs that kind.
    pub(super) fn ready_to_serve(&self) -> bool {
        matches!(
            self,
            Health::Synced | Health::Unavailable(Unavailable::NotFound | Unavailable::TooMany)
        )
    }
}

#[derive(Default)]
pub(super) struct Status {
    pub(super) policies: Health,
    pub(super) drivers: Health,
    pub(super) gpu_clusters: Health,
    pub(super) daemonsets: Health,
    pub(super) pods: Health,
    pub(super) nodes: Health,
    pub(super) deployments: Health,
    pub(super) slices: Health,
    pub(super) plugins: Health,
}

#[derive(Copy, Clone)]
pub(super) enum Kind {
    ClusterPolicies,
    NvidiaDrivers,
    GpuClusters,
    DaemonSets,
    Pods,
    Nodes,
    Deployments,
    ResourceSlices,
    ForeignPlugins,
}

impl Kind {
    pub(super) fn health(self, status: &mut Status) -> &mut Health {
        match self {
            Kind::ClusterPolicies => &mut status.policies,
            Kind::NvidiaDrivers => &mut status.drivers,
            Kind::GpuClusters => &mut status.gpu_clusters,
            Kind::DaemonSets => &mut status.daemonsets,
            Kind::Pods => &mut status.pods,
            Kind::Nodes => &mut status.nodes,
            Kind::Deployments => &mut status.deployments,
            Kind::ResourceSlices => &mut status.slices,
            Kind::ForeignPlugins => &mut status.plugins,
        }
    }

    /// The kind in `cluster_watch_readable`'s label.
    pub(super) fn label(self) -> &'static str {
        match self {
            Kind::ClusterPolicies => "clusterpolicies",
            Kind::NvidiaDrivers => "nvidiadrivers",
            Kind::GpuClusters => "gpuclusters",
            Kind::DaemonSets => "daemonsets",
            Kind::Pods => "pods",
            Kind::Nodes => "nodes",
            Kind::Deployments => "deployments",
            Kind::ResourceSlices => "resourceslices",
            Kind::ForeignPlugins => "daemonsets-anywhere",
        }
    }

    pub(super) fn describe(self, namespace: &str) -> String {
        match self {
            Kind::ClusterPolicies => "clusterpolicies.nvidia.com".to_owned(),
            Kind::NvidiaDrivers => "nvidiadrivers.nvidia.com".to_owned(),
            Kind::GpuClusters => "gpuclusters.nvidia.com".to_owned(),
            Kind::DaemonSets => format!("daemonsets in namespace {namespace}"),
            Kind::Pods => format!("pods in namespace {namespace}"),
            Kind::Nodes => "nodes".to_owned(),
            Kind::Deployments => format!("deployments in namespace {namespace}"),
            Kind::ResourceSlices => format!(
                "resourceslices.resource.k8s.io of driver {}",
                crate::core::dra::NVIDIA_GPU_DRIVER
            ),
            Kind::ForeignPlugins => "device-plugin daemonsets.apps in every namespace".to_owned(),
        }
    }
}

/// A 404 or 403 from a list or watch: the resource or the permission is missing.
pub(super) fn unavailable(error: &watcher::Error) -> Option<Unavailable> {
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

    /// Readiness waits for a kind until it is listed, or until waiting cannot help: a resource
    /// the cluster does not have, or more objects than the guard keeps. A kind RBAC forbids is
    /// waited for (the sync timeout bounds it): it may be allowed a moment later.
    #[test]
    fn readiness_waits_for_a_forbidden_kind_not_for_a_missing_one() {
        assert!(Health::Synced.ready_to_serve());
        assert!(Health::Unavailable(Unavailable::NotFound).ready_to_serve());
        assert!(Health::Unavailable(Unavailable::TooMany).ready_to_serve());
        assert!(!Health::Unavailable(Unavailable::Forbidden).ready_to_serve());
        assert!(!Health::Starting.ready_to_serve());
        assert!(Health::Unavailable(Unavailable::Forbidden).settled());
    }
}
