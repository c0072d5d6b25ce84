//! The Kubernetes objects gpu-deploy-guard reads, reduced to the fields it needs, and how to
//! read them: from a file or standard input ([`read`]), from a large List file in a stream
//! ([`list`], [`split`]) or from the API ([`api`]).

/// Implements `kube::Resource` for a partial view of a built-in kind, so reflectors can watch
/// it while only the fields gpu-deploy-guard reads are deserialized.
macro_rules! partial_resource {
    ($view:ty, $scope:ty, kind: $kind:literal, group: $group:literal, version: $version:literal, plural: $plural:literal) => {
        partial_resource!($view, $scope, kind: $kind, group: $group, version: $version, plural: $plural, metadata_api: false);
    };
    // `metadata_api: true`: the view reads nothing but `metadata`, so `Api` asks the server for
    // `PartialObjectMetadata` (no spec, no status, no images on the wire).
    ($view:ty, $scope:ty, kind: $kind:literal, group: $group:literal, version: $version:literal, plural: $plural:literal, metadata_api: $meta:literal) => {
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
            fn metadata_api() -> bool {
                $meta
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

pub mod api;
pub mod cluster_policy;
pub mod daemonset;
pub mod deployment;
pub mod document;
pub mod fleet;
pub mod foreign;
pub mod gpu_cluster;
pub mod list;
mod meta;
pub mod node;
pub mod nvidia_driver;
pub mod placement;
pub mod pod;
pub mod policy_object;
pub(crate) mod pruned;
pub mod read;
pub mod resource_slice;
pub mod split;
