//! gpu-deploy-guard: keeps the NVIDIA GPU Operator's `nvidia.com/gpu.deploy.*`
//! node labels from breaking a node's GPU stack.
//!
//! The decision lives in [`policy`] and is pure; every other module is a shell
//! around it (HTTP in [`admission`] and [`server`], TLS in [`tls`], the offline
//! command in [`check`], the cluster audit in [`audit`] and the cluster watch
//! of `serve` in [`cluster_watch`]).
#![forbid(unsafe_code)]

/// Implements `kube::Resource` for a partial view of a built-in kind, so reflectors can watch
/// it while only the fields gpu-deploy-guard reads are deserialized.
macro_rules! partial_resource {
    ($view:ty, $scope:ty, kind: $kind:literal, group: $group:literal, version: $version:literal, plural: $plural:literal) => {
        impl kube::Resource for $view {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($group)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($version)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

pub mod admission;
pub mod audit;
pub mod certs;
pub mod check;
pub mod cluster_policy;
pub mod cluster_watch;
pub mod config;
pub mod daemonset;
pub mod metrics;
pub mod node;
pub mod operands;
pub mod pod;
pub mod policy;
pub mod request;
pub mod server;
pub mod tls;
