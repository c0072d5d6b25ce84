//! The operator's DaemonSets: which operand each one runs, and which nodes its
//! real `nodeSelector` picks.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::IgnoredAny;

use super::meta::{PartialMeta, RawOwner, WorkloadSpec};
use super::placement::RawPodPlacement;
use super::pod::PodView;
use crate::core::operands::{Labels, Operand, OperandSet};
use crate::core::placement::PodPlacement;

/// The operand a pod belongs to: its owning DaemonSet's, or, for a pod without owner
/// references, its `app` label's.
pub fn operand_of_pod(pod: &PodView) -> Option<Operand> {
    match (&pod.daemonset, pod.owned) {
        (Some(ds), _) => Operand::of_daemonset(ds),
        (None, false) => pod.app.as_deref().and_then(Operand::of_daemonset),
        (None, true) => None,
    }
}

/// A pod that a DaemonSet runs: owned by one, or, lacking owner references, labelled like an
/// operand's. `TOTAL_PODS` of the matrix counts these.
pub fn is_daemonset_pod(pod: &PodView) -> bool {
    pod.daemonset.is_some() || (!pod.owned && operand_of_pod(pod).is_some())
}

/// A DaemonSet reduced to its name, `spec.template.spec.nodeSelector` and what else of its
/// pod template decides placement (tolerations, hostNetwork, required node affinity).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(from = "RawDaemonSet")]
pub struct DaemonSetView {
    pub metadata: ObjectMeta,
    pub node_selector: Labels,
    pub placement: PodPlacement,
    /// The NVIDIADriver resource whose controller reference it carries: that resource's
    /// driver DaemonSet for one OS pool.
    pub nvidia_driver: Option<String>,
}

impl DaemonSetView {
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }
}

#[derive(Deserialize)]
pub(crate) struct RawDaemonSet {
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    metadata: PartialMeta<IgnoredAny, Vec<RawOwner>>,
    #[serde(default)]
    spec: WorkloadSpec<IgnoredAny, RawPodSpec>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPodSpec {
    #[serde(default)]
    node_selector: Option<Labels>,
    #[serde(flatten)]
    placement: RawPodPlacement,
}

impl From<RawDaemonSet> for DaemonSetView {
    fn from(raw: RawDaemonSet) -> Self {
        let (metadata, _, owners) = raw.metadata.into_parts();
        let nvidia_driver = owners
            .into_iter()
            .find(|o| o.kind == "NVIDIADriver" && o.controller == Some(true))
            .map(|o| o.name);
        DaemonSetView {
            metadata,
            node_selector: raw.spec.template.spec.node_selector.unwrap_or_default(),
            placement: raw.spec.template.spec.placement.into(),
            nvidia_driver,
        }
    }
}

partial_resource!(DaemonSetView, k8s_openapi::NamespaceResourceScope, kind: "DaemonSet", group: "apps", version: "v1", plural: "daemonsets");

/// The operand a DaemonSet runs: recognised by the deploy label its nodeSelector requires as
/// `"true"` (NVIDIADriver's `nvidia-gpu-driver-...` DaemonSets, the kata sandbox device plugin,
/// `nvidia-device-plugin-mps-control-daemon` with `nvidia.com/mps.capable`), else by its name.
pub fn operand_of_daemonset(ds: &DaemonSetView) -> Option<Operand> {
    let by_selector = ds
        .node_selector
        .iter()
        .filter(|(_, v)| v.as_str() == "true")
        .find_map(|(k, _)| Operand::from_key(k));
    by_selector.or_else(|| Operand::of_daemonset(ds.name()))
}

/// The operands whose DaemonSet exists.
pub fn operands_present<'a>(daemonsets: impl IntoIterator<Item = &'a DaemonSetView>) -> OperandSet {
    daemonsets
        .into_iter()
        .filter_map(operand_of_daemonset)
        .collect()
}

/// Real selectors that differ from the default `<deploy key>: "true"`, for
/// [`ClusterFacts::selectors`](crate::core::facts::ClusterFacts). An operand with several
/// DaemonSets (precompiled drivers, one per kernel) keeps the default: each of them also
/// requires the deploy label, and together they cover every kernel.
pub fn custom_selectors<'a>(
    daemonsets: impl IntoIterator<Item = &'a DaemonSetView>,
) -> BTreeMap<Operand, Labels> {
    let mut by_operand: BTreeMap<Operand, Vec<&Labels>> = BTreeMap::new();
    for ds in daemonsets {
        if let Some(op) = operand_of_daemonset(ds) {
            by_operand.entry(op).or_default().push(&ds.node_selector);
        }
    }
    by_operand
        .into_iter()
        .filter_map(|(op, selectors)| match selectors.as_slice() {
            [one] if !is_default(op, one) => Some((op, (*one).clone())),
            _ => None,
        })
        .collect()
}

/// What the operand DaemonSets that exist tell the facts: their real selectors, which of them
/// exist, and (for facts from defaults) that those operands are enabled.
pub fn learn_daemonsets<'a>(
    facts: &mut crate::core::facts::ClusterFacts,
    daemonsets: impl IntoIterator<Item = &'a DaemonSetView> + Clone,
) {
    facts.selectors = custom_selectors(daemonsets.clone());
    facts.nvidia_driver_daemonsets = Some(nvidia_driver_selectors(daemonsets.clone()));
    facts.templates.daemonsets = templates(daemonsets.clone());
    let present = operands_present(daemonsets);
    facts.daemonsets = Some(present);
    facts.enable_seen(present);
}

/// The nodeSelectors of the driver DaemonSets each NVIDIADriver controls (one per OS pool),
/// sorted by DaemonSet name.
pub fn nvidia_driver_selectors<'a>(
    daemonsets: impl IntoIterator<Item = &'a DaemonSetView>,
) -> BTreeMap<String, Vec<Labels>> {
    let mut sorted: Vec<&DaemonSetView> = daemonsets
        .into_iter()
        .filter(|ds| ds.nvidia_driver.is_some())
        .collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out: BTreeMap<String, Vec<Labels>> = BTreeMap::new();
    for ds in sorted {
        if let Some(owner) = &ds.nvidia_driver {
            out.entry(owner.clone())
                .or_default()
                .push(ds.node_selector.clone());
        }
    }
    out
}

/// Each operand's pod template as placement reads it. An operand with several DaemonSets
/// (precompiled drivers, the device plugin and its MPS control daemon) gets the first one's,
/// in name order: the operator renders them all from the same policy tolerations.
pub fn templates<'a>(
    daemonsets: impl IntoIterator<Item = &'a DaemonSetView>,
) -> BTreeMap<Operand, PodPlacement> {
    let mut sorted: Vec<&DaemonSetView> = daemonsets.into_iter().collect();
    sorted.sort_by(|a, b| a.name().cmp(b.name()));
    let mut out = BTreeMap::new();
    for ds in sorted {
        if let Some(op) = operand_of_daemonset(ds) {
            out.entry(op).or_insert_with(|| ds.placement.clone());
        }
    }
    out
}

fn is_default(op: Operand, selector: &Labels) -> bool {
    selector.len() == 1 && selector.get(op.key()).is_some_and(|v| v == "true")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ds(name: &str, selector: &[(&str, &str)]) -> DaemonSetView {
        DaemonSetView {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            node_selector: selector
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            placement: PodPlacement::default(),
            nvidia_driver: None,
        }
    }

    #[test]
    fn an_nvidiadriver_s_daemonsets_are_read_by_their_controller_reference() {
        let list: Vec<DaemonSetView> = serde_json::from_str(
            r#"[{"metadata":{"name":"nvidia-gpu-driver-rhel9.4-7c9","ownerReferences":[
                  {"apiVersion":"nvidia.com/v1alpha1","kind":"NVIDIADriver","name":"pool","uid":"u","controller":true}]},
                 "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.driver":"true","pool":"a"}}}}},
                {"metadata":{"name":"nvidia-gpu-driver-ubuntu22.04-7c9","ownerReferences":[
                  {"kind":"NVIDIADriver","name":"pool","controller":true}]},
                 "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.driver":"true","pool":"b"}}}}},
                {"metadata":{"name":"nvidia-driver-daemonset","ownerReferences":[
                  {"kind":"ClusterPolicy","name":"cluster-policy","controller":true}]},
                 "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.driver":"true"}}}}},
                {"metadata":{"name":"not-controlled","ownerReferences":[{"kind":"NVIDIADriver","name":"x"}]},
                 "spec":{"template":{"spec":{"nodeSelector":{"nvidia.com/gpu.deploy.driver":"true"}}}}}]"#,
        )
        .unwrap();
        assert_eq!(list[0].nvidia_driver.as_deref(), Some("pool"));
        assert_eq!(list[2].nvidia_driver, None);
        assert_eq!(list[3].nvidia_driver, None);
        let by_driver = nvidia_driver_selectors(&list);
        let pools: Vec<&str> = by_driver["pool"]
            .iter()
            .map(|s| s["pool"].as_str())
            .collect();
        assert_eq!((by_driver.len(), pools), (1, vec!["a", "b"]));
    }

    #[test]
    fn daemonsets_are_recognised_by_their_selector_key() {
        let nvd = ds(
            "nvidia-gpu-driver-ubuntu22.04-646cdfdb96",
            &[
                ("nvidia.com/gpu.deploy.driver", "true"),
                ("nvidia.com/gpu.driver.owner", "default"),
            ],
        );
        assert_eq!(operand_of_daemonset(&nvd), Some(Operand::Driver));
        let mps = ds(
            "nvidia-device-plugin-mps-control-daemon",
            &[
                ("nvidia.com/gpu.deploy.device-plugin", "true"),
                ("nvidia.com/mps.capable", "true"),
            ],
        );
        assert_eq!(operand_of_daemonset(&mps), Some(Operand::DevicePlugin));
        let kata = ds(
            "nvidia-kata-sandbox-device-plugin-daemonset",
            &[("nvidia.com/gpu.deploy.kata-sandbox-device-plugin", "true")],
        );
        assert_eq!(
            operand_of_daemonset(&kata),
            Some(Operand::KataSandboxDevicePlugin)
        );
        // The plugin and the MPS daemon together: the plugin's default selector stands.
        let plugin = ds(
            "nvidia-device-plugin-daemonset",
            &[("nvidia.com/gpu.deploy.device-plugin", "true")],
        );
        assert!(custom_selectors([&plugin, &mps]).is_empty());
        assert!(operands_present([&nvd, &kata]).contains(Operand::Driver));
    }

    #[test]
    fn daemonset_names_map_to_operands() {
        assert_eq!(
            Operand::of_daemonset("nvidia-driver-daemonset"),
            Some(Operand::Driver)
        );
        assert_eq!(
            Operand::of_daemonset("nvidia-driver-daemonset-5.15.0-1026-nvidia-ubuntu22.04"),
            Some(Operand::Driver)
        );
        assert_eq!(
            Operand::of_daemonset("gpu-feature-discovery"),
            Some(Operand::GpuFeatureDiscovery)
        );
        assert_eq!(Operand::of_daemonset("nvidia-dcgm"), Some(Operand::Dcgm));
        assert_eq!(
            Operand::of_daemonset("nvidia-dcgm-exporter"),
            Some(Operand::DcgmExporter)
        );
        assert_eq!(
            Operand::of_daemonset("nvidia-device-plugin-mps-control-daemon"),
            None
        );
        assert_eq!(
            Operand::of_daemonset("gpu-operator-node-feature-discovery-worker"),
            None
        );
    }

    #[test]
    fn the_owner_decides_and_the_app_label_is_the_fallback() {
        let mut pod = PodView {
            daemonset: Some("nvidia-container-toolkit-daemonset".into()),
            owned: true,
            app: Some("something-else".into()),
            ..PodView::default()
        };
        assert_eq!(operand_of_pod(&pod), Some(Operand::ContainerToolkit));
        assert!(is_daemonset_pod(&pod));
        pod.daemonset = None;
        assert_eq!(operand_of_pod(&pod), None, "owned by something else");
        assert!(!is_daemonset_pod(&pod));
        pod.owned = false;
        pod.app = Some("nvidia-dcgm-exporter".into());
        assert_eq!(operand_of_pod(&pod), Some(Operand::DcgmExporter));
        assert!(is_daemonset_pod(&pod));
    }

    #[test]
    fn only_selectors_that_differ_from_the_default_are_kept() {
        let list = [
            ds(
                "nvidia-device-plugin-daemonset",
                &[("nvidia.com/gpu.deploy.device-plugin", "true")],
            ),
            ds(
                "gpu-feature-discovery",
                &[
                    ("nvidia.com/gpu.deploy.gpu-feature-discovery", "true"),
                    ("example.com/pool", "a"),
                ],
            ),
            ds("nvidia-driver-daemonset-5.15", &[("k", "5.15")]),
            ds("nvidia-driver-daemonset-6.8", &[("k", "6.8")]),
            ds("unrelated", &[("x", "y")]),
        ];
        let got = custom_selectors(&list);
        assert_eq!(got.len(), 1);
        assert_eq!(
            got[&Operand::GpuFeatureDiscovery].get("example.com/pool"),
            Some(&"a".to_owned())
        );
        let present = operands_present(&list);
        assert_eq!(
            present.iter().collect::<Vec<_>>(),
            [
                Operand::Driver,
                Operand::DevicePlugin,
                Operand::GpuFeatureDiscovery
            ]
        );
    }

    #[test]
    fn a_daemonset_file_entry_gives_name_and_selector() {
        let d: DaemonSetView = serde_json::from_str(
            r#"{"kind":"DaemonSet","metadata":{"name":"nvidia-dcgm-exporter","namespace":"gpu-operator","resourceVersion":"9"},
              "spec":{"selector":{"matchLabels":{"app":"nvidia-dcgm-exporter"}},"template":{"spec":
              {"nodeSelector":{"nvidia.com/gpu.deploy.dcgm-exporter":"true"},"containers":[]}}}}"#,
        )
        .unwrap();
        assert_eq!(d.name(), "nvidia-dcgm-exporter");
        assert_eq!(d.node_selector.len(), 1);
        // Kept for kube's watcher, which re-lists on events without it.
        assert_eq!(d.metadata.resource_version.as_deref(), Some("9"));
    }
}
