//! What the GPU Operator means by its `nvidia.com/gpu.deploy.*` labels.
//!
//! Every operand DaemonSet selects nodes with `nvidia.com/gpu.deploy.<operand>:
//! "true"`, so an operand runs on a node only when that label's value is the
//! exact string `true`. This module holds [`OPERANDS`], the one table of every
//! fact about each operand (add an operand by adding a row, and, when a pausing
//! component owns its key, by adding it to that component's keys in [`super::pauses`]), and
//! the model each era's labelling pass is worked out into from it. Beside it: the settings that
//! choose a node's operands ([`settings`]), [`OperandSet`], the values a deploy
//! label may hold ([`value`]), and deploy labels on a node ([`deploy`]). Where
//! each fact comes from in the operator's source: `docs/gpu-operator.md`.

mod deploy;
mod set;
mod settings;
mod value;
mod workloads;

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;

pub use crate::core::era::Era;
pub use deploy::{
    LabelChange, changed_deploy_labels, closest_known, deploy_labels, is_gpu_node,
    is_unknown_deploy_key,
};
pub use set::OperandSet;
pub use settings::{GPU_CLUSTER_NAME, SandboxMode, Stack, Workload};
pub use value::{DRIVER_PAUSE, MIG_PAUSE, VGPU_PAUSE, Value};

/// Node labels, as the API server stores them.
pub type Labels = BTreeMap<String, String>;

/// A nodeSelector picks a node with these labels: every key of it, with exactly its value.
pub fn selector_matches(selector: &Labels, labels: &Labels) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
}

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
    /// The DRA kubelet plugin: their pods hold an admin-access ResourceClaim of device class
    /// `gpu.nvidia.com`, which nothing allocates on a node the plugin does not serve, so they
    /// stay Pending.
    DraDriver,
}

/// What the GPUCluster (DRA) stack does with an operand (gpu-operator@v26.7.0
/// `controllers/state_manager.go`, `gpuClusterStateLabels`, `devicePluginOnlyStateLabelKeys`;
/// `internal/state/manager.go`, `newGPUClusterStates`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum OnGpuCluster {
    /// In the GPUCluster set: added as `true` (when absent or empty) on GPU nodes; deployed
    /// (the driver by NVIDIADriver resources) unless the GPUCluster's switch, when it has one,
    /// is off. A GPUCluster switch is off when its `spec.<field>` object is absent, and its
    /// `enabled` defaults as given.
    Added(Option<Switch>),
    /// Left alone on GPU nodes, deployed by an NVIDIADriver that may serve either stack
    /// (vgpu-manager).
    Kept,
    /// Deleted from every GPU node, whatever its value; never deployed.
    Swept,
    /// Never touched (nvsm).
    Untouched,
}

/// Label sets of `gpuStateLabels` an operand's key belongs to, one bit per workload (and, for
/// vm-passthrough, per sandbox mode: from v26.3 `getEffectiveStateLabels` gives a `kata` node
/// the kata sandbox device plugin instead of the sandbox device plugin).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Sets(u8);

impl Sets {
    /// `container`.
    pub const CONTAINER: Sets = Sets(1);
    /// `vm-passthrough` in `kubevirt` mode (and every vm-passthrough node before v26.3).
    pub const PASSTHROUGH_KUBEVIRT: Sets = Sets(2);
    /// `vm-passthrough` in `kata` mode (v26.3+).
    pub const PASSTHROUGH_KATA: Sets = Sets(4);
    /// `vm-passthrough`, whatever the mode.
    pub const PASSTHROUGH: Sets = Sets(2 | 4);
    /// `vm-vgpu`.
    pub const VGPU: Sets = Sets(8);
    /// Every workload's set.
    pub const ALL: Sets = Sets(1 | 2 | 4 | 8);

    pub const fn or(self, other: Sets) -> Sets {
        Sets(self.0 | other.0)
    }

    const fn intersects(self, other: Sets) -> bool {
        self.0 & other.0 != 0
    }

    /// The set of a node of this workload under this (era's) mode.
    pub const fn of(workload: Workload, mode: SandboxMode) -> Sets {
        match (workload, mode) {
            (Workload::Container, _) => Sets::CONTAINER,
            (Workload::VmPassthrough, SandboxMode::KubeVirt) => Sets::PASSTHROUGH_KUBEVIRT,
            (Workload::VmPassthrough, SandboxMode::Kata) => Sets::PASSTHROUGH_KATA,
            (Workload::VmVgpu, _) => Sets::VGPU,
        }
    }
}

/// How the operator's labelling pass treats an operand's deploy label.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Labelled {
    /// In the label set of these workloads: added as `true` to their nodes, swept from others.
    In(Sets),
    /// mig-manager's: added as `true` (when absent) on MIG-capable `container` nodes, kept on
    /// every `container` node, swept from the others.
    MigCapable,
    /// Never added, swept from every ClusterPolicy node, never deployed by the ClusterPolicy:
    /// the GPUCluster (DRA) stack's own keys ([`OnGpuCluster`]).
    Swept,
    /// Never touched by the operator: a person or another tool writes it.
    No,
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
    /// The first era whose operator has it: before, the operator neither labels nor sweeps the
    /// key, nor deploys the operand.
    pub since: Era,
    /// The last era whose operator deploys its DaemonSets (the label stays in its sets).
    pub until: Era,
    /// From v26.3, deployed only in this `spec.sandboxWorkloads.mode` (`isStateEnabled`).
    pub mode: Option<SandboxMode>,
    /// How the labelling pass treats its key.
    pub labelled: Labelled,
    /// What its pods wait for on the node.
    pub waits: &'static [Wait],
    /// Its column in `audit -o matrix`: mostly the label's name. The DCGM exporter's column
    /// has always been `dcgm`, so the standalone DCGM host engine's is `dcgm-hostengine`.
    pub column: &'static str,
    /// Always shown: a column of the audit matrix and a row of `check`'s operand table even
    /// where it neither runs nor has a DaemonSet.
    pub always_shown: bool,
    /// A label its DaemonSet selects as `"true"` besides the deploy label, up to an era: the
    /// shipped nodeSelector (`assets/state-*/0500_daemonset.yaml`), used where the real
    /// DaemonSets are not read (`check` without `--daemonsets`, the plugin's preview).
    pub also_selects: Option<AlsoSelects>,
    /// What the GPUCluster (DRA) stack does with it: by default, swept when the ClusterPolicy
    /// labels it, added when it is one of the DRA stack's own keys ([`Labelled::Swept`]),
    /// untouched otherwise.
    pub on_gpu_cluster: OnGpuCluster,
}

/// A label an operand's shipped DaemonSet selects besides its deploy label.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct AlsoSelects {
    pub key: &'static str,
    /// The last era whose DaemonSet selects it.
    pub until: Era,
}

const fn sw(field: &'static str, default: bool) -> Option<Switch> {
    Some(Switch { field, default })
}

/// A row's eras: from the first to the last.
struct Eras(Era, Era);

const ALWAYS: Eras = Eras(Era::V23_3, Era::NEWEST);

const fn since(era: Era) -> Eras {
    Eras(era, Era::NEWEST)
}

#[allow(clippy::too_many_arguments)]
const fn row(
    operand: Operand,
    key: &'static str,
    daemonsets: &'static [&'static str],
    switch: Option<Switch>,
    eras: Eras,
    mode: Option<SandboxMode>,
    labelled: Labelled,
    waits: &'static [Wait],
    column: &'static str,
    always_shown: bool,
) -> OperandInfo {
    OperandInfo {
        operand,
        key,
        daemonsets,
        switch,
        since: eras.0,
        until: eras.1,
        mode,
        labelled,
        waits,
        column,
        always_shown,
        also_selects: None,
        on_gpu_cluster: match labelled {
            Labelled::In(_) | Labelled::MigCapable => OnGpuCluster::Swept,
            Labelled::Swept => OnGpuCluster::Added(None),
            Labelled::No => OnGpuCluster::Untouched,
        },
    }
}

impl OperandInfo {
    /// The row, its DaemonSet selecting `key=true` too up to the era `until`.
    const fn also_selecting(mut self, key: &'static str, until: Era) -> OperandInfo {
        self.also_selects = Some(AlsoSelects { key, until });
        self
    }

    /// The row, the GPUCluster stack treating it as `what`.
    const fn on_gpu_cluster_as(mut self, what: OnGpuCluster) -> OperandInfo {
        self.on_gpu_cluster = what;
        self
    }
}

/// `nvidia.com/cc.capable`: set by GPU feature discovery on confidential-computing capable GPUs.
pub const CC_CAPABLE_KEY: &str = "nvidia.com/cc.capable";

/// A deploy label's full key from its suffix.
macro_rules! k {
    ($suffix:literal) => {
        concat!("nvidia.com/gpu.deploy.", $suffix)
    };
}

use Labelled::{In, MigCapable as MIG, No as NO, Swept as SWEPT};
use Operand as O;
use Wait::{DraDriver as DRA, SandboxValidator as SV, Toolkit as TK, ToolkitReady as TR};
const GC_ADDED: OnGpuCluster = OnGpuCluster::Added(None);

const NONE: &[&str] = &[];
const NO_WAIT: &[Wait] = &[];
const C: Labelled = In(Sets::CONTAINER);
const KUBEVIRT: Option<SandboxMode> = Some(SandboxMode::KubeVirt);
const KATA: Option<SandboxMode> = Some(SandboxMode::Kata);
const ANY: Option<SandboxMode> = None;

/// Every known deploy label, in the order the operator starts its operands (and of [`Operand`]).
#[rustfmt::skip]
pub const OPERANDS: [OperandInfo; 23] = [
    //  operand                      key                                daemonsets                                                  ClusterPolicy switch                  eras                mode       label sets                                                waits for   audit column                   always shown
    row(O::Driver,                   k!("driver"),                      &["nvidia-driver-daemonset", "nvidia-driver-daemonset-*", "nvidia-gpu-driver-*", "nvidia-vgpu-driver-*"],sw("driver", true),                   ALWAYS,             ANY,       C,                                                        NO_WAIT,    "driver",                      true)
        .on_gpu_cluster_as(GC_ADDED),
    row(O::ContainerToolkit,         k!("container-toolkit"),           &["nvidia-container-toolkit-daemonset"],                    sw("toolkit", true),                  ALWAYS,             ANY,       C,                                                        NO_WAIT,    "toolkit",                     true),
    row(O::OperatorValidator,        k!("operator-validator"),          &["nvidia-operator-validator"],                             None,                                 ALWAYS,             ANY,       C,                                                        NO_WAIT,    "operator-validator",          false),
    row(O::DevicePlugin,             k!("device-plugin"),               &["nvidia-device-plugin-daemonset"],                        sw("devicePlugin", true),             ALWAYS,             ANY,       C,                                                        &[TK, TR],  "device-plugin",               true),
    row(O::GpuFeatureDiscovery,      k!("gpu-feature-discovery"),       &["gpu-feature-discovery"],                                 sw("gfd", true),                      ALWAYS,             ANY,       C,                                                        &[TK, TR],  "gfd",                         true),
    row(O::Dcgm,                     k!("dcgm"),                        &["nvidia-dcgm"],                                           sw("dcgm", true),                     ALWAYS,             ANY,       C,                                                        &[TK, TR],  "dcgm-hostengine",             false),
    row(O::DcgmExporter,             k!("dcgm-exporter"),               &["nvidia-dcgm-exporter"],                                  sw("dcgmExporter", true),             ALWAYS,             ANY,       C,                                                        &[TK, TR],  "dcgm",                        true),
    row(O::NodeStatusExporter,       k!("node-status-exporter"),        &["nvidia-node-status-exporter"],                           sw("nodeStatusExporter", false),      ALWAYS,             ANY,       C,                                                        NO_WAIT,    "node-status-exporter",        false),
    row(O::MigManager,               k!("mig-manager"),                 &["nvidia-mig-manager"],                                    sw("migManager", true),               ALWAYS,             ANY,       MIG,                                                      &[TK, TR],  "mig-manager",                 false),
    row(O::SandboxDevicePlugin,      k!("sandbox-device-plugin"),       &["nvidia-sandbox-device-plugin-daemonset"],                sw("sandboxDevicePlugin", false),     ALWAYS,             KUBEVIRT,  In(Sets::PASSTHROUGH_KUBEVIRT.or(Sets::VGPU)),            &[SV],      "sandbox-device-plugin",       false),
    row(O::KataSandboxDevicePlugin,  k!("kata-sandbox-device-plugin"),  &["nvidia-kata-sandbox-device-plugin-daemonset"],           sw("kataSandboxDevicePlugin", false), since(Era::V26_3),  KATA,      In(Sets::PASSTHROUGH_KATA),                               &[SV],      "kata-sandbox-device-plugin",  false),
    row(O::SandboxValidator,         k!("sandbox-validator"),           &["nvidia-sandbox-validator"],                              None,                                 ALWAYS,             ANY,       In(Sets::PASSTHROUGH.or(Sets::VGPU)),                     NO_WAIT,    "sandbox-validator",           false),
    row(O::VfioManager,              k!("vfio-manager"),                &["nvidia-vfio-manager"],                                   sw("vfioManager", false),             ALWAYS,             ANY,       In(Sets::PASSTHROUGH),                                    NO_WAIT,    "vfio-manager",                false),
    row(O::VgpuManager,              k!("vgpu-manager"),                &["nvidia-vgpu-manager-daemonset", "nvidia-vgpu-manager-*", "nvidia-vgpu-host-manager-driver-*"],sw("vgpuManager", false),             ALWAYS,             ANY,       In(Sets::VGPU),                                           NO_WAIT,    "vgpu-manager",                false)
        .on_gpu_cluster_as(OnGpuCluster::Kept),
    row(O::VgpuDeviceManager,        k!("vgpu-device-manager"),         &["nvidia-vgpu-device-manager"],                            sw("vgpuDeviceManager", false),       ALWAYS,             ANY,       In(Sets::VGPU),                                           &[SV],      "vgpu-device-manager",         false),
    row(O::CcManager,                k!("cc-manager"),                  &["nvidia-cc-manager"],                                     sw("ccManager", false),               since(Era::V24_9),  KATA,      In(Sets::PASSTHROUGH.or(Sets::VGPU)),                     NO_WAIT,    "cc-manager",                  false)
        .also_selecting(CC_CAPABLE_KEY, Era::V24_9),
    row(O::KataManager,              k!("kata-manager"),                &["nvidia-kata-manager"],                                   sw("kataManager", false),             Eras(Era::V24_9, Era::V26_3), ANY, In(Sets::PASSTHROUGH),                                    NO_WAIT,    "kata-manager",                false),
    row(O::Nvsm,                     k!("nvsm"),                        NONE,                                                       None,                                 ALWAYS,             ANY,       NO,                                                       NO_WAIT,    "nvsm",                        false),
    row(O::Client,                   k!("client"),                      NONE,                                                       None,                                 since(Era::V26_7),  ANY,       In(Sets::ALL),                                            NO_WAIT,    "client",                      false),
    row(O::DraDriver,                k!("dra-driver"),                  &["nvidia-dra-driver-kubelet-plugin"],                      None,                                 since(Era::V26_7),  ANY,       SWEPT,                                                    NO_WAIT,    "dra-driver",                  false),
    row(O::DraValidator,             k!("dra-validator"),               &["nvidia-dra-validator"],                                  None,                                 since(Era::V26_7),  ANY,       SWEPT,                                                    &[DRA],     "dra-validator",               false),
    row(O::DcgmDra,                  k!("dcgm-dra"),                    &["nvidia-dcgm-dra"],                                       None,                                 since(Era::V26_7),  ANY,       SWEPT,                                                    &[DRA],     "dcgm-dra",                    false)
        .on_gpu_cluster_as(OnGpuCluster::Added(sw("dcgm", false))),
    row(O::DcgmExporterDra,          k!("dcgm-exporter-dra"),           &["nvidia-dcgm-exporter-dra"],                              None,                                 since(Era::V26_7),  ANY,       SWEPT,                                                    &[DRA],     "dcgm-exporter-dra",           false)
        .on_gpu_cluster_as(OnGpuCluster::Added(sw("dcgmExporter", true))),
];

/// What an era's labelling pass does, worked out from the rows once, at compile time.
#[derive(Copy, Clone)]
struct EraModel {
    /// Per [`Sets`] bit: the label set of a node of that workload and mode.
    sets: [OperandSet; 4],
    /// Every key the pass may delete (in a sweep or for `operands=false`).
    managed: OperandSet,
    /// Keys added on MIG-capable container nodes and kept on every container node.
    mig: OperandSet,
    /// Per sandbox mode: the operands this era's ClusterPolicy never deploys under it.
    not_deployed: [OperandSet; 2],
    /// On the GPUCluster stack: the keys added on GPU nodes, the keys deleted from them, and
    /// the operands never deployed.
    gpu_cluster_set: OperandSet,
    gpu_cluster_sweep: OperandSet,
    gpu_cluster_not_deployed: OperandSet,
}

const fn era_model(era: Era) -> EraModel {
    let mut m = EraModel {
        sets: [OperandSet::EMPTY; 4],
        managed: OperandSet::EMPTY,
        mig: OperandSet::EMPTY,
        not_deployed: [OperandSet::EMPTY; 2],
        gpu_cluster_set: OperandSet::EMPTY,
        gpu_cluster_sweep: OperandSet::EMPTY,
        gpu_cluster_not_deployed: OperandSet::EMPTY,
    };
    let mut i = 0;
    while i < OPERANDS.len() {
        let info = &OPERANDS[i];
        let op = OperandSet::of(&[info.operand]);
        let has = era.reaches(info.since);
        if has {
            match info.labelled {
                Labelled::In(sets) => {
                    let mut bit = 0;
                    while bit < 4 {
                        if sets.0 & (1 << bit) != 0 {
                            m.sets[bit] = m.sets[bit].union(op);
                        }
                        bit += 1;
                    }
                    m.managed = m.managed.union(op);
                }
                Labelled::MigCapable => {
                    m.mig = m.mig.union(op);
                    m.managed = m.managed.union(op);
                }
                Labelled::Swept => m.managed = m.managed.union(op),
                Labelled::No => {}
            }
        }
        if !info.daemonsets.is_empty() {
            let mut mode = 0;
            while mode < 2 {
                let wrong_mode = match info.mode {
                    Some(needed) => {
                        era.has_sandbox_mode() && needed as u8 != SandboxMode::ALL[mode] as u8
                    }
                    None => false,
                };
                let gpu_cluster_only = matches!(info.labelled, Labelled::Swept);
                if !has || !info.until.reaches(era) || wrong_mode || gpu_cluster_only {
                    m.not_deployed[mode] = m.not_deployed[mode].union(op);
                }
                mode += 1;
            }
        }
        let on_gpu_cluster = match info.on_gpu_cluster {
            OnGpuCluster::Added(_) => {
                if has {
                    m.gpu_cluster_set = m.gpu_cluster_set.union(op);
                }
                true
            }
            OnGpuCluster::Kept => true,
            OnGpuCluster::Swept => {
                if has {
                    m.gpu_cluster_sweep = m.gpu_cluster_sweep.union(op);
                }
                false
            }
            OnGpuCluster::Untouched => false,
        };
        if !info.daemonsets.is_empty() && (!has || !on_gpu_cluster) {
            m.gpu_cluster_not_deployed = m.gpu_cluster_not_deployed.union(op);
        }
        i += 1;
    }
    m
}

/// Every era's model, in the order of [`Era::ALL`].
const ERA_MODELS: [EraModel; Era::ALL.len()] = {
    let mut models = [era_model(Era::ALL[0]); Era::ALL.len()];
    let mut i = 1;
    while i < models.len() {
        models[i] = era_model(Era::ALL[i]);
        i += 1;
    }
    models
};

/// `gpuStateLabels[workload]` as this era's `getEffectiveStateLabels` returns it.
pub fn label_set(era: Era, workload: Workload, mode: SandboxMode) -> OperandSet {
    let bit = Sets::of(workload, mode.in_era(era)).0.trailing_zeros() as usize;
    ERA_MODELS[era as usize].sets[bit]
}

/// Every operand whose deploy label this era's operator may delete, in a sweep or for
/// `operands=false`.
pub fn managed(era: Era) -> OperandSet {
    ERA_MODELS[era as usize].managed
}

/// The operands whose label is added on MIG-capable `container` nodes and kept on every
/// `container` node ([`Labelled::MigCapable`]).
pub fn mig_labelled(era: Era) -> OperandSet {
    ERA_MODELS[era as usize].mig
}

/// The operands this era's operator never deploys on this stack under this sandbox mode
/// (`isStateEnabled`): outside the row's eras, (from v26.3) needing the other mode, or
/// belonging to the other stack. With both custom resources nothing is reconciled: what each
/// stack may have deployed before stays.
pub fn not_deployed(era: Era, mode: SandboxMode, stack: Stack) -> OperandSet {
    let m = &ERA_MODELS[era as usize];
    let policy = m.not_deployed[mode as usize];
    match stack.in_era(era) {
        Stack::ClusterPolicy => policy,
        Stack::GpuCluster => m.gpu_cluster_not_deployed,
        Stack::Both => policy.intersection(m.gpu_cluster_not_deployed),
    }
}

/// On the GPUCluster stack of this era: the keys the labelling pass adds on a GPU node, and
/// the keys it deletes there (`updateGPUClusterStateLabels`, `devicePluginOnlyStateLabelKeys`).
pub fn gpu_cluster_labels(era: Era) -> (OperandSet, OperandSet) {
    let m = &ERA_MODELS[era as usize];
    (m.gpu_cluster_set, m.gpu_cluster_sweep)
}

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

    /// Whether its shipped DaemonSet of this era selects a node with these labels: the deploy
    /// label `"true"`, and the label it also selects `"true"` where it does.
    pub fn shipped_selector_matches(&self, labels: &Labels, era: Era) -> bool {
        let is_true = |key: &str| labels.get(key).is_some_and(|v| v == "true");
        is_true(self.key)
            && self
                .also_selects
                .is_none_or(|also| era > also.until || is_true(also.key))
    }

    /// The operator creates a DaemonSet for it.
    pub fn has_daemonset(&self) -> bool {
        !self.daemonsets.is_empty()
    }

    /// Deployed only when the ClusterPolicy's `spec.sandboxWorkloads.enabled` is true as well:
    /// its label belongs to a VM workload's set and not to the container set.
    pub fn needs_sandbox(&self) -> bool {
        let vm = Sets::PASSTHROUGH.or(Sets::VGPU);
        matches!(self.labelled, Labelled::In(s) if s.intersects(vm) && !s.intersects(Sets::CONTAINER))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every per-operand fact the model uses is read from the operand's row: for each row and
    /// each era, workload and mode, what the model derives is what the row's columns say. A new
    /// row (and its variant) is therefore all a new operand needs.
    #[test]
    fn every_column_is_what_the_model_reads() {
        for info in &OPERANDS {
            lookups_read_the_row(info);
            for era in Era::ALL {
                for mode in SandboxMode::ALL {
                    cluster_policy_model_reads_the_row(info, era, mode);
                }
                gpu_cluster_model_reads_the_row(info, era);
            }
        }
    }

    /// The operand's key, DaemonSets, waits, column, switch and sandbox need are its row's.
    fn lookups_read_the_row(info: &OperandInfo) {
        use crate::core::facts::switched_off;
        let op = info.operand;
        assert_eq!(op.info().key, info.key);
        assert_eq!(Operand::from_key(info.key), Some(op));
        for name in info.daemonsets {
            let name = name.replace('*', "x-5.15");
            assert_eq!(Operand::of_daemonset(&name), Some(op), "{name}");
        }
        for w in [
            Wait::Toolkit,
            Wait::ToolkitReady,
            Wait::SandboxValidator,
            Wait::DraDriver,
        ] {
            assert_eq!(op.waits_for(w), info.waits.contains(&w), "{op:?} {w:?}");
        }
        assert_eq!(op.column(), info.column);
        assert_eq!(Operand::always_shown().any(|o| o == op), info.always_shown);
        // The switch, and the sandbox workloads it needs: off when its own switch is off,
        // or when sandbox workloads are.
        let off = |field: &str, sandbox: bool| {
            let Ok(set) = switched_off(|f, _| {
                Ok::<bool, std::convert::Infallible>(if f == "sandboxWorkloads" {
                    sandbox
                } else {
                    f != field
                })
            });
            set.contains(op)
        };
        match info.switch {
            Some(s) => assert!(off(s.field, true), "{op:?}: its switch"),
            None => assert!(!off("-", true), "{op:?} has no switch"),
        }
        assert_eq!(off("-", false), info.needs_sandbox(), "{op:?}: sandbox");
    }

    /// The ClusterPolicy stack's label sets and deployments in this era and mode.
    fn cluster_policy_model_reads_the_row(info: &OperandInfo, era: Era, mode: SandboxMode) {
        let op = info.operand;
        let has = era >= info.since;
        let sets = |w| label_set(era, w, mode).contains(op);
        let want = |w| match info.labelled {
            Labelled::In(s) => has && s.intersects(Sets::of(w, mode.in_era(era))),
            _ => false,
        };
        for w in Workload::ALL {
            assert_eq!(sets(w), want(w), "{op:?} {era:?} {w:?} {mode:?}");
        }
        let deployed = info.has_daemonset()
            && has
            && era <= info.until
            && info.labelled != Labelled::Swept
            && (era < Era::V26_3 || info.mode.is_none_or(|m| m == mode));
        assert_eq!(
            !not_deployed(era, mode, Stack::ClusterPolicy).contains(op),
            deployed || !info.has_daemonset(),
            "{op:?} {era:?} {mode:?}: deployed"
        );
        // Before v26.7 a GPUCluster stack is the ClusterPolicy's.
        if era < Era::V26_7 {
            assert_eq!(
                not_deployed(era, mode, Stack::GpuCluster),
                not_deployed(era, mode, Stack::ClusterPolicy)
            );
        }
    }

    /// The GPUCluster stack deploys its own operands and what NVIDIADriver resources render
    /// (driver, vGPU manager), labels its set and sweeps the rest; and the keys every pass
    /// manages.
    fn gpu_cluster_model_reads_the_row(info: &OperandInfo, era: Era) {
        let op = info.operand;
        let has = era >= info.since;
        let (set, sweep) = gpu_cluster_labels(era);
        let on_gc = matches!(
            info.on_gpu_cluster,
            OnGpuCluster::Added(_) | OnGpuCluster::Kept
        );
        if era >= Era::V26_7 {
            assert_eq!(
                !not_deployed(era, SandboxMode::KubeVirt, Stack::GpuCluster).contains(op),
                (has && on_gc) || !info.has_daemonset(),
                "{op:?} {era:?}: deployed on the GPUCluster stack"
            );
        }
        assert_eq!(
            set.contains(op),
            has && matches!(info.on_gpu_cluster, OnGpuCluster::Added(_)),
            "{op:?} {era:?}: GPUCluster set"
        );
        assert_eq!(
            sweep.contains(op),
            has && info.on_gpu_cluster == OnGpuCluster::Swept,
            "{op:?} {era:?}: GPUCluster sweep"
        );
        assert_eq!(
            managed(era).contains(op),
            has && info.labelled != Labelled::No,
            "{op:?} {era:?}: managed"
        );
        assert_eq!(
            mig_labelled(era).contains(op),
            has && info.labelled == Labelled::MigCapable
        );
    }

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
        }
        assert_eq!(
            Operand::DevicePlugin.key(),
            "nvidia.com/gpu.deploy.device-plugin"
        );
        assert_eq!(Operand::from_key(OPERANDS_KEY), None);
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
}
