//! DaemonSets anywhere in the cluster, read only for whether they run the NVIDIA device plugin
//! and where they place it ([`crate::core::foreign`]). Everything else of them is skipped
//! without being built.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::meta::{PartialMeta, WorkloadSpec};
use super::placement::RawPodPlacement;
use crate::core::foreign::{ForeignPlugin, is_device_plugin_container};
use crate::core::operands::Labels;
use crate::core::placement::PodPlacement;

/// A DaemonSet: its name and namespace, and, when a container of its pod template runs the
/// NVIDIA device plugin, where the template places it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawAnyDaemonSet")]
pub struct AnyDaemonSetView {
    pub metadata: ObjectMeta,
    /// `None`: no container of it runs the device plugin.
    pub plugin: Option<(Labels, PodPlacement)>,
}

#[derive(Deserialize)]
pub(crate) struct RawAnyDaemonSet {
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    metadata: PartialMeta,
    #[serde(default)]
    spec: WorkloadSpec<IgnoredAny, RawPluginPodSpec>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPluginPodSpec {
    #[serde(default)]
    node_selector: Option<Labels>,
    #[serde(default)]
    containers: Vec<RawContainer>,
    #[serde(flatten)]
    placement: RawPodPlacement,
}

#[derive(Default, Deserialize)]
struct RawContainer {
    #[serde(default)]
    image: String,
    #[serde(default)]
    command: Option<Vec<String>>,
}

impl From<RawAnyDaemonSet> for AnyDaemonSetView {
    fn from(raw: RawAnyDaemonSet) -> Self {
        let (metadata, _, _) = raw.metadata.into_parts();
        let spec = raw.spec.template.spec;
        let plugin = spec
            .containers
            .iter()
            .any(|c| {
                let command = c
                    .command
                    .as_ref()
                    .and_then(|c| c.first())
                    .map(String::as_str);
                is_device_plugin_container(&c.image, command)
            })
            .then(|| {
                (
                    spec.node_selector.unwrap_or_default(),
                    spec.placement.into(),
                )
            });
        AnyDaemonSetView { metadata, plugin }
    }
}

partial_resource!(AnyDaemonSetView, k8s_openapi::NamespaceResourceScope, kind: "DaemonSet", group: "apps", version: "v1", plural: "daemonsets");

impl AnyDaemonSetView {
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The device plugin it runs, unless it is in the operator's namespace (the operator's own).
    pub fn foreign_plugin(&self, operator_namespace: &str) -> Option<ForeignPlugin> {
        let (node_selector, placement) = self.plugin.clone()?;
        (self.namespace() != operator_namespace).then(|| ForeignPlugin {
            namespace: self.namespace().to_owned(),
            name: self.name().to_owned(),
            node_selector,
            placement,
        })
    }
}

/// The foreign device plugins among `daemonsets`, sorted by namespace and name.
pub fn foreign_plugins<'a>(
    daemonsets: impl IntoIterator<Item = &'a AnyDaemonSetView>,
    operator_namespace: &str,
) -> Vec<ForeignPlugin> {
    let mut out: Vec<ForeignPlugin> = daemonsets
        .into_iter()
        .filter_map(|d| d.foreign_plugin(operator_namespace))
        .collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(namespace: &str, name: &str, image: &str, command: Option<&str>) -> AnyDaemonSetView {
        let mut container = serde_json::json!({"name": "c", "image": image});
        if let Some(c) = command {
            container["command"] = serde_json::json!([c]);
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
            "spec": {"template": {"spec": {
                "nodeSelector": {"nvidia.com/gpu.deploy.device-plugin": "true"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [container]
            }}}
        }))
        .unwrap()
    }

    #[test]
    fn only_device_plugins_outside_the_operator_namespace_are_foreign() {
        let image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.1";
        let all = [
            ds(
                "nvidia-device-plugin",
                "nvdp-nvidia-device-plugin",
                image,
                Some("nvidia-device-plugin"),
            ),
            ds(
                "nvidia-device-plugin",
                "nvdp-gpu-feature-discovery",
                image,
                Some("gpu-feature-discovery"),
            ),
            ds(
                "gpu-operator",
                "nvidia-device-plugin-daemonset",
                image,
                None,
            ),
            ds(
                "kube-system",
                "kube-proxy",
                "registry.k8s.io/kube-proxy:v1.34.0",
                None,
            ),
        ];
        let foreign = foreign_plugins(&all, "gpu-operator");
        assert_eq!(foreign.len(), 1);
        let p = &foreign[0];
        assert_eq!(p.id(), "nvidia-device-plugin/nvdp-nvidia-device-plugin");
        assert_eq!(
            p.node_selector
                .get("nvidia.com/gpu.deploy.device-plugin")
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(p.placement.tolerations.len(), 1);
        assert_eq!(all[0].metadata.resource_version.as_deref(), Some("1"));
    }
}
