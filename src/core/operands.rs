//! What the GPU Operator means by its `nvidia.com/gpu.deploy.*` labels.
//!
//! Every operand DaemonSet selects nodes with `nvidia.com/gpu.deploy.<operand>:
//! "true"`, so an operand runs on a node only when that label's value is the
//! exact string `true`. This module holds [`OPERANDS`], the one table of every
//! fact about each operand (add an operand by adding a row), and the vocabulary
//! of values the operator's own components write. Where each fact comes from in
//! the operator's source: `docs/gpu-operator.md`.

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
/// NFD's OS labels: an NVIDIADriver's DaemonSets are one per OS pool, and a node without them
/// is in no pool, so it gets no driver pod (`getNodePools`, `docs/gpu-operator.md` §11.4).
pub const NFD_OS_KEYS: [&str; 2] = [
    "feature.node.kubernetes.io/system-os_release.ID",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID",
];
/// NFD's kernel label: with `usePrecompiled` the pools are per OS and kernel.
pub const NFD_KERNEL_KEY: &str = "feature.node.kubernetes.io/kernel-version.full";

/// A deploy-label key that is neither the operands switch nor any operand's label.
pub fn is_unknown_deploy_key(key: &str) -> bool {
    key.starts_with(DEPLOY_PREFIX) && key != OPERANDS_KEY && Operand::from_key(key).is_none()
}

/// The deploy labels among these labels, in key order, found without looking at the others.
pub fn deploy_labels(labels: &Labels) -> impl Iterator<Item = (&String, &String)> {
    use std::ops::Bound;
    labels
        .range::<str, _>((Bound::Included(DEPLOY_PREFIX), Bound::Unbounded))
        .take_while(|(k, _)| k.starts_with(DEPLOY_PREFIX))
}

/// A deploy label whose value a request changes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct LabelChange<'a> {
    pub key: &'a str,
    /// Its value before the request; `None` when absent (or for CREATE).
    pub old: Option<&'a str>,
    /// Its value after; `None` when the request removes it.
    pub new: Option<&'a str>,
}

/// The deploy labels whose value differs between `old` (`None` for CREATE: no labels) and
/// `new`, in key order: one walk over both label maps' deploy labels.
pub fn changed_deploy_labels<'a>(old: Option<&'a Labels>, new: &'a Labels) -> Vec<LabelChange<'a>> {
    use std::cmp::Ordering;
    let mut out = Vec::new();
    let mut olds = old.into_iter().flat_map(deploy_labels).peekable();
    let mut news = deploy_labels(new).peekable();
    loop {
        let order = match (olds.peek(), news.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((o, _)), Some((n, _))) => o.cmp(n),
        };
        let change = match order {
            Ordering::Less => olds.next().map(|(k, v)| (k, Some(v), None)),
            Ordering::Greater => news.next().map(|(k, v)| (k, None, Some(v))),
            Ordering::Equal => match (olds.next(), news.next()) {
                (Some((k, o)), Some((_, n))) if o != n => Some((k, Some(o), Some(n))),
                _ => None,
            },
        };
        if let Some((key, old, new)) = change {
            out.push(LabelChange {
                key,
                old: old.map(String::as_str),
                new: new.map(String::as_str),
            });
        }
    }
    out
}

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

/// How a ClusterPolicy switches an operand: `spec.<field>.enabled`, and the operator's default
/// when the field is absent (`api/nvidia/v1/clusterpolicy_types.go`, the `IsEnabled` methods).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    pub field: &'static str,
    pub default: bool,
}

/// Something an operand's pods wait for on the node before they do anything useful.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// The container toolkit's `nvidia` runtime: without it the pods wait forever.
    Toolkit,
    /// The operator validator's `toolkit-ready` file: their init container waits for it.
    ToolkitReady,
    /// The sandbox validator's files (`workload-type`, `vfio-pci-ready`, `vgpu-devices-ready`,
    /// `vgpu-manager-ready`): their init containers wait for them.
    SandboxValidator,
}

/// Who puts the deploy label on a node.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Writer {
    /// The operator adds it (as `true`) to GPU nodes and re-adds it when it is deleted.
    Operator,
    /// A person or another tool; the operator leaves it alone.
    Others,
}

/// Every fact about one operand. [`OPERANDS`] holds one row per operand; a new fact is a new
/// field here and a new column there. The sources of the facts: `docs/gpu-operator.md`.
#[derive(Debug)]
pub struct OperandInfo {
    pub operand: Operand,
    /// Full label key, `nvidia.com/gpu.deploy.<suffix>`.
    pub key: &'static str,
    /// Names of the operand DaemonSets the operator creates (none for some); a name ending in
    /// `*` stands for every name with that prefix (the precompiled driver's per-kernel ones).
    pub daemonsets: &'static [&'static str],
    /// The ClusterPolicy switch, for operands that have one.
    pub switch: Option<Switch>,
    /// Deployed only when the ClusterPolicy's `spec.sandboxWorkloads.enabled` is true as well.
    pub sandbox: bool,
    /// What its pods wait for on the node.
    pub waits: &'static [Wait],
    /// Who writes its deploy label.
    pub writer: Writer,
    /// Its column in `audit -o matrix`: mostly the label's name. The DCGM exporter's column
    /// has always been `dcgm`, so the standalone DCGM host engine's is `dcgm-hostengine`.
    pub column: &'static str,
    /// Always shown: a column of the audit matrix and a row of `check`'s operand table even
    /// where it neither runs nor has a DaemonSet.
    pub always_shown: bool,
}

const fn sw(field: &'static str, default: bool) -> Option<Switch> {
    Some(Switch { field, default })
}

#[allow(clippy::too_many_arguments)]
const fn row(
    operand: Operand,
    key: &'static str,
    daemonsets: &'static [&'static str],
    switch: Option<Switch>,
    sandbox: bool,
    waits: &'static [Wait],
    writer: Writer,
    column: &'static str,
    always_shown: bool,
) -> OperandInfo {
    OperandInfo {
        operand,
        key,
        daemonsets,
        switch,
        sandbox,
        waits,
        writer,
        column,
        always_shown,
    }
}

/// A deploy label's full key from its suffix.
macro_rules! k {
    ($suffix:literal) => {
        concat!("nvidia.com/gpu.deploy.", $suffix)
    };
}

use Operand as O;
use Wait::{SandboxValidator as SV, Toolkit as TK, ToolkitReady as TR};
use Writer::{Operator as OPERATOR, Others as OTHERS};

const NONE: &[&str] = &[];
const NO_WAIT: &[Wait] = &[];

/// Every known deploy label, in the order the operator starts its operands (and of [`Operand`]).
#[rustfmt::skip]
pub const OPERANDS: [OperandInfo; 23] = [
    //  operand                      key                                daemonsets                                                  ClusterPolicy switch               sandbox waits for   label by   audit column                   always shown
    row(O::Driver,                   k!("driver"),                      &["nvidia-driver-daemonset", "nvidia-driver-daemonset-*", "nvidia-gpu-driver-*", "nvidia-vgpu-driver-*"],sw("driver", true),                false,  NO_WAIT,    OPERATOR,  "driver",                      true),
    row(O::ContainerToolkit,         k!("container-toolkit"),           &["nvidia-container-toolkit-daemonset"],                    sw("toolkit", true),               false,  NO_WAIT,    OPERATOR,  "toolkit",                     true),
    row(O::OperatorValidator,        k!("operator-validator"),          &["nvidia-operator-validator"],                             None,                              false,  NO_WAIT,    OPERATOR,  "operator-validator",          false),
    row(O::DevicePlugin,             k!("device-plugin"),               &["nvidia-device-plugin-daemonset"],                        sw("devicePlugin", true),          false,  &[TK, TR],  OPERATOR,  "device-plugin",               true),
    row(O::GpuFeatureDiscovery,      k!("gpu-feature-discovery"),       &["gpu-feature-discovery"],                                 sw("gfd", true),                   false,  &[TK, TR],  OPERATOR,  "gfd",                         true),
    row(O::Dcgm,                     k!("dcgm"),                        &["nvidia-dcgm"],                                           sw("dcgm", true),                  false,  &[TK, TR],  OPERATOR,  "dcgm-hostengine",             false),
    row(O::DcgmExporter,             k!("dcgm-exporter"),               &["nvidia-dcgm-exporter"],                                  sw("dcgmExporter", true),          false,  &[TK, TR],  OPERATOR,  "dcgm",                        true),
    row(O::NodeStatusExporter,       k!("node-status-exporter"),        &["nvidia-node-status-exporter"],                           sw("nodeStatusExporter", false),   false,  NO_WAIT,    OPERATOR,  "node-status-exporter",        false),
    row(O::MigManager,               k!("mig-manager"),                 &["nvidia-mig-manager"],                                    sw("migManager", true),            false,  &[TK, TR],  OPERATOR,  "mig-manager",                 false),
    row(O::SandboxDevicePlugin,      k!("sandbox-device-plugin"),       &["nvidia-sandbox-device-plugin-daemonset"],                sw("sandboxDevicePlugin", false),  true,   &[SV],        OTHERS,    "sandbox-device-plugin",       false),
    row(O::KataSandboxDevicePlugin,  k!("kata-sandbox-device-plugin"),  &["nvidia-kata-sandbox-device-plugin-daemonset"],           sw("kataSandboxDevicePlugin", false), true, &[SV],     OTHERS,    "kata-sandbox-device-plugin",  false),
    row(O::SandboxValidator,         k!("sandbox-validator"),           &["nvidia-sandbox-validator"],                              None,                              true,   NO_WAIT,    OTHERS,    "sandbox-validator",           false),
    row(O::VfioManager,              k!("vfio-manager"),                &["nvidia-vfio-manager"],                                   sw("vfioManager", false),          true,   NO_WAIT,    OTHERS,    "vfio-manager",                false),
    row(O::VgpuManager,              k!("vgpu-manager"),                &["nvidia-vgpu-manager-daemonset", "nvidia-vgpu-manager-*"],sw("vgpuManager", false),          true,   NO_WAIT,    OTHERS,    "vgpu-manager",                false),
    row(O::VgpuDeviceManager,        k!("vgpu-device-manager"),         &["nvidia-vgpu-device-manager"],                            sw("vgpuDeviceManager", false),    true,   &[SV],        OTHERS,    "vgpu-device-manager",         false),
    row(O::CcManager,                k!("cc-manager"),                  &["nvidia-cc-manager"],                                     sw("ccManager", false),            true,   NO_WAIT,    OTHERS,    "cc-manager",                  false),
    row(O::KataManager,              k!("kata-manager"),                &["nvidia-kata-manager"],                                   sw("kataManager", false),          true,   NO_WAIT,    OTHERS,    "kata-manager",                false),
    row(O::Nvsm,                     k!("nvsm"),                        NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "nvsm",                        false),
    row(O::Client,                   k!("client"),                      NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "client",                      false),
    row(O::DraDriver,                k!("dra-driver"),                  NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "dra-driver",                  false),
    row(O::DraValidator,             k!("dra-validator"),               NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "dra-validator",               false),
    row(O::DcgmDra,                  k!("dcgm-dra"),                    NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "dcgm-dra",                    false),
    row(O::DcgmExporterDra,          k!("dcgm-exporter-dra"),           NONE,                                                       None,                              false,  NO_WAIT,    OTHERS,    "dcgm-exporter-dra",           false),
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

    /// The operand whose DaemonSet has this name.
    pub fn of_daemonset(name: &str) -> Option<Operand> {
        OPERANDS.iter().find(|i| i.runs_as(name)).map(|i| i.operand)
    }

    /// Its pods wait for `what` on the node.
    pub fn waits_for(self, what: Wait) -> bool {
        self.info().waits.contains(&what)
    }

    /// Its column in `audit -o matrix`.
    pub fn column(self) -> &'static str {
        self.info().column
    }

    /// The operands always shown by `audit` and `check`, in table order.
    pub fn always_shown() -> impl Iterator<Item = Operand> {
        OPERANDS
            .iter()
            .filter(|i| i.always_shown)
            .map(|i| i.operand)
    }
}

impl OperandInfo {
    /// A DaemonSet of this name runs the operand.
    pub fn runs_as(&self, daemonset: &str) -> bool {
        self.daemonsets
            .iter()
            .any(|name| match name.strip_suffix('*') {
                Some(prefix) => daemonset.starts_with(prefix),
                None => *name == daemonset,
            })
    }

    /// The operator creates a DaemonSet for it.
    pub fn has_daemonset(&self) -> bool {
        !self.daemonsets.is_empty()
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

    /// The set of these operands, for constants.
    pub const fn of(ops: &[Operand]) -> OperandSet {
        let mut bits = 0;
        let mut i = 0;
        while i < ops.len() {
            bits |= 1 << ops[i] as u32;
            i += 1;
        }
        OperandSet(bits)
    }

    pub const fn union(self, other: OperandSet) -> OperandSet {
        OperandSet(self.0 | other.0)
    }

    /// The operands of this set that are not in `other`.
    pub const fn without(self, other: OperandSet) -> OperandSet {
        OperandSet(self.0 & !other.0)
    }

    pub fn remove(&mut self, op: Operand) {
        self.0 &= !(1 << op as u32);
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
    // A label name has at most 63 characters; a longer one matches nothing, and the distance
    // would cost time in the square of its length.
    if suffix.len() > 63 {
        return None;
    }
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
    fn daemonset_names_and_columns_come_from_the_table() {
        assert_eq!(
            Operand::of_daemonset("nvidia-driver-daemonset-5.15.0-1026-nvidia-ubuntu22.04"),
            Some(Operand::Driver),
            "a precompiled driver's per-kernel DaemonSet"
        );
        assert_eq!(
            Operand::of_daemonset("nvidia-driver-daemonset"),
            Some(Operand::Driver)
        );
        assert_eq!(Operand::of_daemonset("nvidia-driver"), None);
        let shown: Vec<&str> = Operand::always_shown().map(Operand::column).collect();
        assert_eq!(shown, ["driver", "toolkit", "device-plugin", "gfd", "dcgm"]);
        assert!(!Operand::Nvsm.info().has_daemonset());
    }

    #[test]
    fn operand_set_holds_every_operand() {
        let all: OperandSet = Operand::all().collect();
        assert_eq!(all.iter().count(), OPERANDS.len());
        let one: OperandSet = [Operand::DcgmExporterDra].into_iter().collect();
        assert!(one.contains(Operand::DcgmExporterDra));
        assert!(!one.contains(Operand::Driver));
    }

    #[test]
    fn changed_deploy_labels_are_the_differences_in_key_order() {
        let l = |pairs: &[(&str, &str)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let d = |s: &str| format!("{DEPLOY_PREFIX}{s}");
        let old = l(&[
            (&d("dcgm"), "true"),
            (&d("device-plugin"), "true"),
            (&d("driver"), "true"),
            ("nvidia.com/gpu.present", "true"),
            ("zz/other", "a"),
        ]);
        let new = l(&[
            (&d("container-toolkit"), "false"),
            (&d("device-plugin"), "true"),
            (&d("driver"), ""),
            ("nvidia.com/gpu.present", "false"),
        ]);
        let got: Vec<(String, Option<&str>, Option<&str>)> =
            changed_deploy_labels(Some(&old), &new)
                .into_iter()
                .map(|c| (c.key.to_owned(), c.old, c.new))
                .collect();
        assert_eq!(
            got,
            [
                (d("container-toolkit"), None, Some("false")),
                (d("dcgm"), Some("true"), None),
                (d("driver"), Some("true"), Some("")),
            ]
        );
        // CREATE: every deploy label is written.
        let created: Vec<&str> = changed_deploy_labels(None, &new)
            .iter()
            .map(|c| c.key)
            .collect();
        assert_eq!(created.len(), 3);
        assert!(changed_deploy_labels(Some(&old), &old).is_empty());
    }

    #[test]
    fn operand_set_constants_and_differences() {
        let a = OperandSet::of(&[Operand::Driver, Operand::Dcgm]);
        let b = OperandSet::of(&[Operand::Dcgm, Operand::Nvsm]);
        assert_eq!(a.union(b).iter().count(), 3);
        assert_eq!(a.without(b).iter().collect::<Vec<_>>(), [Operand::Driver]);
        let mut c = a;
        c.remove(Operand::Driver);
        assert_eq!(c.iter().collect::<Vec<_>>(), [Operand::Dcgm]);
    }
}
