//! A `resource.k8s.io` ResourceSlice reduced to what the decision reads: its name, its driver
//! and the node it is local to ([`crate::core::dra`]). Its devices, which can be hundreds per
//! slice, are skipped without being built. The three served versions (v1 from Kubernetes 1.34,
//! v1beta2 from 1.33, v1beta1 from 1.32) name these fields alike, so the view is read at
//! whichever version the cluster serves best ([`served`]).

use std::borrow::Cow;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::ApiResource;
use serde::{Deserialize, Deserializer};

use super::meta::PartialMeta;
use crate::core::dra::SliceRef;

#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResourceSliceView {
    #[serde(default, deserialize_with = "partial_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SliceSpec,
}

/// `spec.driver` and `spec.nodeName`; `kind` is read for list files.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SliceSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub node_name: Option<String>,
}

fn partial_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Ok(PartialMeta::<serde::de::IgnoredAny>::deserialize(d)?
        .into_parts()
        .0)
}

impl ResourceSliceView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    pub fn as_ref(&self) -> SliceRef<'_> {
        SliceRef {
            name: self.name(),
            driver: &self.spec.driver,
            node: self.spec.node_name.as_deref(),
        }
    }
}

/// The view at the version its [`ApiResource`] names ([`served`]): `Api::all_with`.
impl kube::Resource for ResourceSliceView {
    type DynamicType = ApiResource;
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(ar: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&ar.kind)
    }
    fn group(ar: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&ar.group)
    }
    fn version(ar: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&ar.version)
    }
    fn api_version(ar: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&ar.api_version)
    }
    fn plural(ar: &ApiResource) -> Cow<'_, str> {
        Cow::Borrowed(&ar.plural)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The API group of ResourceSlices.
pub const GROUP: &str = "resource.k8s.io";

/// The ResourceSlices at the most stable version the cluster serves; `None` when it serves no
/// `resource.k8s.io` group (DRA off, or a cluster before 1.32): no slice can exist.
pub async fn served(client: &kube::Client) -> Result<Option<ApiResource>, kube::Error> {
    match kube::discovery::group(client, GROUP).await {
        Ok(group) => Ok(slices_of(group.resources_by_stability())),
        Err(kube::Error::Discovery(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

fn slices_of<C>(resources: Vec<(ApiResource, C)>) -> Option<ApiResource> {
    resources
        .into_iter()
        .map(|(ar, _)| ar)
        .find(|ar| ar.kind == "ResourceSlice")
}

/// The field selector that narrows a list or watch to the slices of NVIDIA's GPU DRA driver
/// (the API server indexes `spec.driver` and `spec.nodeName`).
pub fn field_selector() -> String {
    format!("spec.driver={}", crate::core::dra::NVIDIA_GPU_DRIVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_gives_its_driver_and_node_and_skips_its_devices() {
        let json = r#"{"apiVersion":"resource.k8s.io/v1","kind":"ResourceSlice",
            "metadata":{"name":"gpu-1-gpu.nvidia.com-x","resourceVersion":"7","managedFields":[{}]},
            "spec":{"driver":"gpu.nvidia.com","nodeName":"gpu-1","pool":{"name":"gpu-1","generation":1,"resourceSliceCount":1},
              "devices":[{"name":"gpu-0","attributes":{"uuid":{"string":"GPU-1"}},"capacity":{"memory":{"value":"80Gi"}}}]}}"#;
        let s: ResourceSliceView = serde_json::from_str(json).unwrap();
        let r = s.as_ref();
        assert_eq!(
            (r.name, r.driver, r.node),
            ("gpu-1-gpu.nvidia.com-x", "gpu.nvidia.com", Some("gpu-1"))
        );
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        let all_nodes =
            r#"{"metadata":{"name":"x"},"spec":{"driver":"gpu.nvidia.com","allNodes":true}}"#;
        let s: ResourceSliceView = serde_json::from_str(all_nodes).unwrap();
        assert_eq!(s.as_ref().node, None);
        assert_eq!(field_selector(), "spec.driver=gpu.nvidia.com");
    }

    #[test]
    fn the_view_is_read_at_the_version_the_cluster_serves() {
        use kube::Resource;
        let at = |version: &str| ApiResource {
            group: GROUP.into(),
            version: version.into(),
            api_version: format!("{GROUP}/{version}"),
            kind: "ResourceSlice".into(),
            plural: "resourceslices".into(),
        };
        let other = ApiResource {
            kind: "DeviceClass".into(),
            plural: "deviceclasses".into(),
            ..at("v1")
        };
        assert_eq!(
            slices_of(vec![(other.clone(), ()), (at("v1beta1"), ())]),
            Some(at("v1beta1"))
        );
        assert_eq!(slices_of(vec![(other, ())]), None);
        assert_eq!(
            ResourceSliceView::url_path(&at("v1beta2"), None),
            "/apis/resource.k8s.io/v1beta2/resourceslices"
        );
    }
}
