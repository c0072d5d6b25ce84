//! What the GPU Operator means by its `nvidia.com/gpu.deploy.*` labels.
//!
//! Every operand DaemonSet selects nodes with `nvidia.com/gpu.deploy.<operand>:
//! "true"`, so an operand runs on a node only when that label's value is the
//! exact string `true`. This module holds the table of known keys and the
//! vocabulary of values the operator's own components write.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

/// Node labels, as the API server stores them.
pub type Labels = BTreeMap<String, String>;

/// Prefix of every deploy label.
pub const DEPLOY_PREFIX: &str = "nvidia.com/gpu.deploy.";
/// The control label: `false` (exactly) makes the operator delete every deploy label.
pub const OPERANDS_KEY: &str = "nvidia.com/gpu.deploy.operands";
/// Set by the operator on nodes where NFD found an NVIDIA PCI device.
pub const GPU_PRESENT_KEY: &str = "nvidia.com/gpu.present";
/// NFD labels the operator reads to decide that a node has an NVIDIA GPU.
pub const NFD_NVIDIA_PCI_KEYS: [&str; 3] = [
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
];

/// A component that the GPU Operator (or a tool next to it) schedules with a deploy label.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operand {
    Driver,
    ContainerToolkit,
    OperatorValidator,
    DevicePlugin,
    GpuFeatureDiscovery,
    Dcgm,
    DcgmExporter,
    NodeStatusExporter,
    MigManager,
    SandboxDevicePlugin,
    KataSandboxDevicePlugin,
    SandboxValidator,
    VfioManager,
    VgpuManager,
    VgpuDeviceManager,
    CcManager,
    KataManager,
    Nvsm,
    Client,
    DraDriver,
    DraValidator,
    DcgmDra,
    DcgmExporterDra,
}

/// Facts about one operand. The table below is the single source for all of them.
#[derive(Debug)]
pub struct OperandInfo {
    pub operand: Operand,
    /// Full label key, `nvidia.com/gpu.deploy.<suffix>`.
    pub key: &'static str,
    /// Name of the operand DaemonSet the operator creates, where there is one.
    pub daemonset: Option<&'static str>,
    /// Its init container waits for the validator's `toolkit-ready` file.
    pub waits_for_toolkit_ready: bool,
    /// Needs the container toolkit's `nvidia` runtime to do anything useful.
    pub needs_toolkit: bool,
    /// The operator itself adds this label (as `true`) to GPU nodes and re-adds it when deleted.
    pub operator_labels: bool,
}

macro_rules! info {
    ($op:ident, $suffix:literal, $ds:expr, $waits:literal, $needs:literal, $labels:literal) => {
        OperandInfo {
            operand: Operand::$op,
            key: concat!("nvidia.com/gpu.deploy.", $suffix),
            daemonset: $ds,
            waits_for_toolkit_ready: $waits,
            needs_toolkit: $needs,
            operator_labels: $labels,
        }
    };
}

/// Every known deploy label, in the order the operator starts its operands.
pub const OPERANDS: [OperandInfo; 23] = [
    //    operand                    suffix                        DaemonSet                                      waits  needs  labelled
    info!(
        Driver,
        "driver",
        Some("nvidia-driver-daemonset"),
        false,
        false,
        true
    ),
    info!(
        ContainerToolkit,
        "container-toolkit",
        Some("nvidia-container-toolkit-daemonset"),
        false,
        false,
        true
    ),
    info!(
        OperatorValidator,
        "operator-validator",
        Some("nvidia-operator-validator"),
        false,
        false,
        true
    ),
    info!(
        DevicePlugin,
        "device-plugin",
        Some("nvidia-device-plugin-daemonset"),
        true,
        true,
        true
    ),
    info!(
        GpuFeatureDiscovery,
        "gpu-feature-discovery",
        Some("gpu-feature-discovery"),
        true,
        true,
        true
    ),
    info!(Dcgm, "dcgm", Some("nvidia-dcgm"), true, true, true),
    info!(
        DcgmExporter,
        "dcgm-exporter",
        Some("nvidia-dcgm-exporter"),
        true,
        true,
        true
    ),
    info!(
        NodeStatusExporter,
        "node-status-exporter",
        Some("nvidia-node-status-exporter"),
        false,
        false,
        true
    ),
    info!(
        MigManager,
        "mig-manager",
        Some("nvidia-mig-manager"),
        false,
        true,
        true
    ),
    info!(
        SandboxDevicePlugin,
        "sandbox-device-plugin",
        Some("nvidia-sandbox-device-plugin-daemonset"),
        false,
        false,
        false
    ),
    info!(
        KataSandboxDevicePlugin,
        "kata-sandbox-device-plugin", None, false, false, false
    ),
    info!(
        SandboxValidator,
        "sandbox-validator",
        Some("nvidia-sandbox-validator"),
        false,
        false,
        false
    ),
    info!(
        VfioManager,
        "vfio-manager",
        Some("nvidia-vfio-manager"),
        false,
        false,
        false
    ),
    info!(
        VgpuManager,
        "vgpu-manager",
        Some("nvidia-vgpu-manager-daemonset"),
        false,
        false,
        false
    ),
    info!(
        VgpuDeviceManager,
        "vgpu-device-manager",
        Some("nvidia-vgpu-device-manager"),
        false,
        false,
        false
    ),
    info!(
        CcManager,
        "cc-manager",
        Some("nvidia-cc-manager"),
        false,
        false,
        false
    ),
    info!(
        KataManager,
        "kata-manager",
        Some("nvidia-kata-manager"),
        false,
        false,
        false
    ),
    info!(Nvsm, "nvsm", None, false, false, false),
    info!(Client, "client", None, false, false, false),
    info!(DraDriver, "dra-driver", None, false, false, false),
    info!(DraValidator, "dra-validator", None, false, false, false),
    info!(DcgmDra, "dcgm-dra", None, false, false, false),
    info!(
        DcgmExporterDra,
        "dcgm-exporter-dra", None, false, false, false
    ),
];

impl Operand {
    pub fn info(self) -> &'static OperandInfo {
        // The table is ordered like the enum; the unit test `table_matches_enum_order` proves it.
        &OPERANDS[self as usize]
    }

    /// The full label key, e.g. `nvidia.com/gpu.deploy.device-plugin`.
    pub fn key(self) -> &'static str {
        self.info().key
    }

    /// The key without its prefix, e.g. `device-plugin`: the name people use.
    pub fn name(self) -> &'static str {
        &self.key()[DEPLOY_PREFIX.len()..]
    }

    /// The operand a full label key stands for.
    pub fn from_key(key: &str) -> Option<Operand> {
        OPERANDS.iter().find(|i| i.key == key).map(|i| i.operand)
    }

    /// The operand a short name (`device-plugin`) stands for.
    pub fn from_name(name: &str) -> Option<Operand> {
        OPERANDS
            .iter()
            .find(|i| &i.key[DEPLOY_PREFIX.len()..] == name)
            .map(|i| i.operand)
    }

    pub fn all() -> impl Iterator<Item = Operand> {
        OPERANDS.iter().map(|i| i.operand)
    }
}

impl fmt::Display for Operand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl Serialize for Operand {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The set of operands the DaemonSet controller will run on a node.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct OperandSet(u32);

impl OperandSet {
    pub const EMPTY: OperandSet = OperandSet(0);

    pub fn contains(self, op: Operand) -> bool {
        self.0 & (1 << op as u32) != 0
    }

    pub fn insert(&mut self, op: Operand) {
        self.0 |= 1 << op as u32;
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Operand> {
        Operand::all().filter(move |op| self.contains(*op))
    }

    /// Every known operand mapped to whether it runs: the JSON form used by `check`.
    pub fn to_map(self) -> BTreeMap<&'static str, bool> {
        Operand::all()
            .map(|op| (op.name(), self.contains(op)))
            .collect()
    }
}

impl FromIterator<Operand> for OperandSet {
    fn from_iter<I: IntoIterator<Item = Operand>>(iter: I) -> Self {
        let mut set = OperandSet::EMPTY;
        for op in iter {
            set.insert(op);
        }
        set
    }
}

/// What a deploy label's value means, to the DaemonSet controller and to the people and
/// components that write it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Exactly `true`: the only value that schedules the operand.
    On,
    /// Exactly `false`: kept off, and the operator never overwrites it.
    Off,
    /// The empty string: nothing is scheduled (k8s-driver-manager's patches can leave it).
    Empty,
    /// `pre-installed`: k8s-driver-manager saw a driver on the host.
    PreInstalled,
    /// `paused-for-*` or `<value>_paused-for-driver-upgrade`: an upgrade or MIG/vGPU change is running.
    Paused,
    /// A person probably meant "on" (`True`, `yes`, `1`, `enabled`, ` true`), yet it schedules nothing.
    LooksOn,
    /// A person probably meant "off" (`False`, `no`, `0`, `disabled`): off, as intended.
    LooksOff,
    /// Anything else: schedules nothing, and no component writes it.
    Other,
}

impl Value {
    pub fn of(value: &str) -> Value {
        match value {
            "true" => return Value::On,
            "false" => return Value::Off,
            "" => return Value::Empty,
            "pre-installed" => return Value::PreInstalled,
            _ => {}
        }
        if value.starts_with("paused-for-") || value.ends_with("_paused-for-driver-upgrade") {
            return Value::Paused;
        }
        match value.trim().to_ascii_lowercase().as_str() {
            "true" | "yes" | "y" | "on" | "1" | "enabled" | "enable" => Value::LooksOn,
            "false" | "no" | "n" | "off" | "0" | "disabled" | "disable" => Value::LooksOff,
            _ => Value::Other,
        }
    }

    /// Written by the operator, k8s-driver-manager, mig-manager or vgpu-device-manager themselves.
    pub fn is_component_written(self) -> bool {
        matches!(
            self,
            Value::On | Value::Off | Value::Empty | Value::PreInstalled | Value::Paused
        )
    }
}

/// Whether the operator treats the node as a GPU node (and so manages its deploy labels).
pub fn is_gpu_node(labels: &Labels) -> bool {
    labels.get(GPU_PRESENT_KEY).map(String::as_str) == Some("true")
        || NFD_NVIDIA_PCI_KEYS
            .iter()
            .any(|k| labels.get(*k).map(String::as_str) == Some("true"))
}

/// The known deploy-label suffix closest to an unknown one, for a did-you-mean hint.
pub fn closest_known(suffix: &str) -> Option<&'static str> {
    let candidates = OPERANDS
        .iter()
        .map(|i| &i.key[DEPLOY_PREFIX.len()..])
        .chain(std::iter::once("operands"));
    candidates
        .map(|name| (strsim::jaro_winkler(suffix, name), name))
        .filter(|(score, _)| *score >= 0.85)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, name)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_enum_order() {
        for (i, info) in OPERANDS.iter().enumerate() {
            assert_eq!(
                info.operand as usize, i,
                "{:?} is out of order",
                info.operand
            );
            assert!(info.key.starts_with(DEPLOY_PREFIX));
        }
    }

    #[test]
    fn names_round_trip() {
        for op in Operand::all() {
            assert_eq!(Operand::from_key(op.key()), Some(op));
            assert_eq!(Operand::from_name(op.name()), Some(op));
        }
        assert_eq!(
            Operand::DevicePlugin.key(),
            "nvidia.com/gpu.deploy.device-plugin"
        );
        assert_eq!(Operand::from_key(OPERANDS_KEY), None);
    }

    #[test]
    fn only_exact_true_is_on() {
        assert_eq!(Value::of("true"), Value::On);
        for v in ["True", "TRUE", "yes", "1", "enabled", " true", "on"] {
            assert_eq!(Value::of(v), Value::LooksOn, "{v:?}");
        }
        for v in ["False", "no", "0", "disabled"] {
            assert_eq!(Value::of(v), Value::LooksOff, "{v:?}");
        }
    }

    #[test]
    fn component_values_are_recognised() {
        assert_eq!(Value::of("false"), Value::Off);
        assert_eq!(Value::of(""), Value::Empty);
        assert_eq!(Value::of("pre-installed"), Value::PreInstalled);
        assert_eq!(Value::of("paused-for-driver-upgrade"), Value::Paused);
        assert_eq!(Value::of("paused-for-mig-change"), Value::Paused);
        assert_eq!(Value::of("paused-for-vgpu-change"), Value::Paused);
        assert_eq!(
            Value::of("pre-installed_paused-for-driver-upgrade"),
            Value::Paused
        );
        assert_eq!(Value::of("maybe"), Value::Other);
    }

    #[test]
    fn typos_get_a_suggestion() {
        assert_eq!(closest_known("container-tookit"), Some("container-toolkit"));
        assert_eq!(closest_known("device-plugins"), Some("device-plugin"));
        assert_eq!(closest_known("dcgm-exportr"), Some("dcgm-exporter"));
        assert_eq!(closest_known("zzzz"), None);
    }

    #[test]
    fn gpu_node_is_recognised_by_operator_or_nfd_label() {
        let mut labels = Labels::new();
        assert!(!is_gpu_node(&labels));
        labels.insert(GPU_PRESENT_KEY.into(), "false".into());
        assert!(!is_gpu_node(&labels));
        labels.insert(NFD_NVIDIA_PCI_KEYS[1].into(), "true".into());
        assert!(is_gpu_node(&labels));
    }

    #[test]
    fn operand_set_holds_every_operand() {
        let all: OperandSet = Operand::all().collect();
        assert_eq!(all.iter().count(), OPERANDS.len());
        let one: OperandSet = [Operand::DcgmExporterDra].into_iter().collect();
        assert!(one.contains(Operand::DcgmExporterDra));
        assert!(!one.contains(Operand::Driver));
    }
}
