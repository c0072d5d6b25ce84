//! Device-plugin DaemonSets the GPU Operator does not own: the standalone device-plugin chart
//! installed beside the operator, in another namespace, selecting
//! `nvidia.com/gpu.deploy.device-plugin=true` or NVIDIA nodes (NVIDIA/gpu-operator#1704). Such a
//! plugin advertises `nvidia.com/gpu` like the operator's: beside it, two plugins register the
//! same resource with the kubelet, which keeps whichever registered last; without the
//! operator's container toolkit, it advertises GPUs that pods cannot open.

use crate::core::operands::Labels;
use crate::core::placement::{NodePlacement, PodPlacement};
use crate::core::seen::Seen;

/// The image the NVIDIA device plugin ships in (`nvcr.io/nvidia/k8s-device-plugin:v0.17.1`),
/// shared with GPU feature discovery and the MPS control daemon, which it runs under other
/// commands.
pub const DEVICE_PLUGIN_IMAGE: &str = "k8s-device-plugin";

/// The device plugin's command in that image.
pub const DEVICE_PLUGIN_COMMAND: &str = "nvidia-device-plugin";

/// A device-plugin DaemonSet outside the operator's namespace, as placement reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignPlugin {
    pub namespace: String,
    pub name: String,
    pub node_selector: Labels,
    pub placement: PodPlacement,
}

/// The device-plugin DaemonSets outside the operator's namespace, sorted by namespace and name.
pub type ForeignPlugins = Seen<Vec<ForeignPlugin>>;

impl ForeignPlugin {
    /// Whether the DaemonSet controller runs (or keeps running) its pod on the node.
    pub fn runs_on(&self, node: &str, labels: &Labels, placement: &NodePlacement) -> bool {
        let selected = self
            .node_selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v));
        self.placement
            .place(node, labels, selected, placement)
            .keeps_running()
    }

    /// The label keys its placement reads: a keeper of node records keeps them.
    pub fn label_keys(&self) -> impl Iterator<Item = &str> {
        self.node_selector
            .keys()
            .map(String::as_str)
            .chain(self.placement.affinity.iter().flat_map(|a| a.label_keys()))
    }

    /// `namespace/name`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// Whether a container runs the NVIDIA device plugin: its image is [`DEVICE_PLUGIN_IMAGE`]
/// (any registry, tag or digest) and its command, if it has one, is [`DEVICE_PLUGIN_COMMAND`].
pub fn is_device_plugin_container(image: &str, command: Option<&str>) -> bool {
    let without_digest = image.split('@').next().unwrap_or_default();
    let last = without_digest.rsplit('/').next().unwrap_or_default();
    let repo = last.split(':').next().unwrap_or_default();
    let runs_plugin = command.is_none_or(|c| c.rsplit('/').next() == Some(DEVICE_PLUGIN_COMMAND));
    repo == DEVICE_PLUGIN_IMAGE && runs_plugin
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::placement::{Taint, Toleration};

    #[test]
    fn the_device_plugin_is_told_from_gfd_and_mps_in_the_same_image() {
        for (image, command, plugin) in [
            ("nvcr.io/nvidia/k8s-device-plugin:v0.17.1", None, true),
            (
                "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                Some("nvidia-device-plugin"),
                true,
            ),
            (
                "registry.local:5000/mirror/k8s-device-plugin@sha256:ab12",
                Some("/usr/bin/nvidia-device-plugin"),
                true,
            ),
            (
                "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                Some("gpu-feature-discovery"),
                false,
            ),
            (
                "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
                Some("mps-control-daemon"),
                false,
            ),
            ("nvcr.io/nvidia/gpu-operator:v25.3.4", None, false),
            ("k8s-device-plugin-fork:1", None, false),
            ("", None, false),
        ] {
            assert_eq!(
                is_device_plugin_container(image, command),
                plugin,
                "{image} {command:?}"
            );
        }
    }

    #[test]
    fn it_runs_where_its_selector_and_tolerations_place_it() {
        let plugin = ForeignPlugin {
            namespace: "nvidia-device-plugin".into(),
            name: "nvdp".into(),
            node_selector: [(
                "nvidia.com/gpu.deploy.device-plugin".to_owned(),
                "true".to_owned(),
            )]
            .into(),
            placement: PodPlacement::default(),
        };
        let on: Labels = [(
            "nvidia.com/gpu.deploy.device-plugin".to_owned(),
            "true".to_owned(),
        )]
        .into();
        let off = Labels::new();
        let clean = NodePlacement::default();
        assert!(plugin.runs_on("n", &on, &clean));
        assert!(!plugin.runs_on("n", &off, &clean));
        let tainted = NodePlacement {
            taints: vec![Taint::parse("nvidia.com/gpu", "", "NoExecute").unwrap()],
            unschedulable: false,
        };
        assert!(!plugin.runs_on("n", &on, &tainted));
        let tolerating = ForeignPlugin {
            placement: PodPlacement::tolerating(vec![Toleration::exists("nvidia.com/gpu", None)]),
            ..plugin.clone()
        };
        assert!(tolerating.runs_on("n", &on, &tainted));
        assert_eq!(plugin.id(), "nvidia-device-plugin/nvdp");
        assert_eq!(
            plugin.label_keys().collect::<Vec<_>>(),
            ["nvidia.com/gpu.deploy.device-plugin"]
        );
    }
}
