//! A `resource.k8s.io/v1` ResourceSlice reduced to what the decision reads: its name, its
//! driver and the node it is local to ([`crate::core::dra`]). Its devices, which can be
//! hundreds per slice, are skipped without being built.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
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

partial_resource!(ResourceSliceView, k8s_openapi::ClusterResourceScope, kind: "ResourceSlice", group: "resource.k8s.io", version: "v1", plural: "resourceslices");

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
}
