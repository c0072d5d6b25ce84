//! What the GPU Operator and its helpers will do to a node's deploy labels, by version.
//!
//! A pure model of the operator's labelling pass (`gpuStateLabels` and the
//! `gpuWorkloadConfiguration` methods of `controllers/state_manager.go`, the
//! v26.7 node-labelling controller) and of the components that pause and
//! restore labels (k8s-driver-manager, mig-parted, vgpu-device-manager).
//! `docs/gpu-operator.md` holds the facts and their sources; the end-to-end
//! oracle (`tests/e2e/oracle/`) holds this model to the real operator.

use std::collections::BTreeMap;

use crate::core::era::Era;
// Re-exported from their homes (`core::era`, `core::pauses`) for the callers that name them here.
pub use crate::core::era::{OperatorVersion, Outside};
use crate::core::operands::{
    GPU_PRESENT_KEY, Labels, NFD_NVIDIA_PCI_KEYS, OPERANDS_KEY, Operand, OperandSet, SandboxMode,
    Stack, Workload, deploy_labels, gpu_cluster_labels, label_set, managed, mig_labelled,
};
pub use crate::core::pauses::restored_value;

const WORKLOAD: &str = "nvidia.com/gpu.workload.config";
const MIG_CAPABLE: &str = "nvidia.com/mig.capable";
const PRODUCT: &str = "nvidia.com/gpu.product";
const VGPU_HOST_DRIVER: &str = "nvidia.com/vgpu.host-driver-version";
/// The labels besides the deploy labels, `gpu.present` and NFD's that the labelling pass reads:
/// the decision, and so the webhook, must keep them (`policy::reads_label`).
pub const PASS_READS: [&str; 4] = [WORKLOAD, MIG_CAPABLE, PRODUCT, VGPU_HOST_DRIVER];

/// The ClusterPolicy's sandbox settings, as far as labelling needs them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sandbox {
    pub enabled: bool,
    /// `defaultWorkload` when it is a valid workload.
    pub default_workload: Option<Workload>,
    pub mode: SandboxMode,
}

/// What the operator (or the component that paused it) will do to one deploy label.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LabelAction {
    /// Absent (or, from v26.7, empty): the operator sets it to `true`.
    Add,
    /// In the node's set with a value: left as it is.
    Keep,
    /// Outside the node's set: the operator deletes it, whatever its value.
    Sweep,
    /// Paused by k8s-driver-manager, mig-manager or vgpu-device-manager: comes back as `to`.
    RestoreFromPaused { to: String },
    /// A key the operator does not manage (nvsm, unknown keys, ...): nobody changes it.
    Untouched,
}

impl LabelAction {
    pub fn as_str(&self) -> &'static str {
        match self {
            LabelAction::Add => "add",
            LabelAction::Keep => "keep",
            LabelAction::Sweep => "sweep",
            LabelAction::RestoreFromPaused { .. } => "restore-from-paused",
            LabelAction::Untouched => "untouched",
        }
    }
}

/// The outcome of one labelling pass over a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pass {
    /// The node's labels after the pass (all of them, not only deploy labels).
    pub labels: Labels,
    /// Per deploy-label key present before or after: what happens to it.
    pub actions: BTreeMap<String, LabelAction>,
    /// The workload the operator applies (None: not a GPU node, nothing applied, or the
    /// GPUCluster stack, which has no workloads).
    pub workload: Option<Workload>,
    /// `operands=false`: every operator label goes.
    pub operands_disabled: bool,
    /// The stack whose label set the pass applied to a GPU node, `None` when it applied none
    /// (not a GPU node, `operands=false`, or both custom resources, when nothing is labelled).
    pub applied: Option<Stack>,
}

/// What one labelling pass does, worked out once from the few labels it reads: applied to a
/// whole node by [`labelling_pass`], or asked about single labels by the decision, which needs
/// only the labels a request changes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    era: Era,
    /// The value the pass writes to `nvidia.com/gpu.present`, when it writes one.
    present: Option<&'static str>,
    /// The workload the operator applies (None: not a GPU node, operands disabled, or the
    /// GPUCluster stack).
    pub workload: Option<Workload>,
    /// `operands=false`: every operator label goes (the GPUCluster stack ignores it).
    pub operands_disabled: bool,
    /// The stack whose label set the pass applies to a GPU node ([`Pass::applied`]).
    pub applied: Option<Stack>,
    /// Deploy labels the pass deletes, whatever their value.
    pub sweep: OperandSet,
    /// Deploy labels the pass adds as `true` when absent (from v26.7 also when empty).
    wanted: OperandSet,
    /// Deploy labels the pass adds as `true` only when absent (an empty one stays): mig-manager's
    /// on a MIG-capable container node.
    wanted_if_absent: OperandSet,
}

impl Plan {
    /// The pass over a node with these labels; `nfd`: an NFD label says the node has an NVIDIA
    /// PCI device ([`has_nfd_gpu`]).
    pub fn new(labels: &Labels, nfd: bool, era: Era, sandbox: &Sandbox, stack: Stack) -> Plan {
        let stack = stack.in_era(era);
        let present = labels.get(GPU_PRESENT_KEY).is_some_and(|v| v == "true");
        // gpu.present follows NFD: set when NFD sees a GPU, flipped to false (and every
        // operator label swept) when it no longer does. A GPU node after the pass is an NFD one.
        let (write, flipped_off) = match (present, nfd) {
            (false, true) => (Some("true"), false),
            (true, false) => (Some("false"), true),
            _ => (None, false),
        };
        // Only the ClusterPolicy's pass reads operands=false (`updateGPUStateLabels`,
        // gpu-operator@v26.7.0 `controllers/nodelabeling_controller.go`); with both custom
        // resources there is no pass.
        let operands_disabled =
            stack == Stack::ClusterPolicy && labels.get(OPERANDS_KEY).is_some_and(|v| v == "false");
        let mut plan = Plan {
            era,
            present: write,
            workload: None,
            operands_disabled,
            applied: None,
            sweep: OperandSet::EMPTY,
            wanted: OperandSet::EMPTY,
            wanted_if_absent: OperandSet::EMPTY,
        };
        if stack == Stack::Both {
            // Both custom resources: the node-labelling reconcile errors out before labelling.
            plan.present = None;
            return plan;
        }
        if !nfd {
            // v26.7's node-labelling controller strips every node without gpu.present=true.
            if flipped_off || era.sweeps_non_gpu_nodes() {
                plan.sweep = managed(era);
            }
        } else if operands_disabled {
            plan.sweep = managed(era);
        } else if stack == Stack::GpuCluster {
            let (set, sweep) = gpu_cluster_labels(era);
            plan.applied = Some(Stack::GpuCluster);
            plan.sweep = sweep;
            plan.wanted = set;
        } else {
            let w = workload(labels, sandbox);
            let set = label_set(era, w, sandbox.mode);
            let container = w == Workload::Container;
            let mig = if container {
                mig_labelled(era)
            } else {
                OperandSet::EMPTY
            };
            plan.workload = Some(w);
            plan.applied = Some(Stack::ClusterPolicy);
            plan.sweep = managed(era).without(set.union(mig));
            plan.wanted = set;
            if mig_capable(labels) {
                plan.wanted_if_absent = mig;
            }
        }
        plan
    }

    /// The value the pass leaves on `op`'s deploy label, which has `value` now (None: absent).
    pub fn value_after<'v>(&self, op: Operand, value: Option<&'v str>) -> Option<&'v str> {
        if self.sweep.contains(op) {
            return None;
        }
        let added = match value {
            None => self.wanted.union(self.wanted_if_absent).contains(op),
            Some("") => self.wanted.contains(op) && self.era.resets_empty_values(),
            Some(_) => false,
        };
        if added { Some("true") } else { value }
    }

    /// The operands whose deploy label the pass adds as `true` (absent or emptied now) on a
    /// node with these labels, in table order.
    pub fn added<'l>(&self, labels: &'l Labels) -> impl Iterator<Item = Operand> + 'l {
        let plan = *self;
        Operand::all().filter(move |op| {
            let now = labels.get(op.key()).map(String::as_str);
            let after = plan.value_after(*op, now);
            after.is_some() && after != now
        })
    }
}

/// An NFD label says the node has an NVIDIA PCI device (`hasGPULabels`).
pub fn has_nfd_gpu(labels: &Labels) -> bool {
    NFD_NVIDIA_PCI_KEYS
        .iter()
        .any(|k| labels.get(*k).is_some_and(|v| v == "true"))
}

/// `hasMIGCapableGPU`: never on a vGPU host; `nvidia.com/mig.capable` when present, else the
/// product name.
pub fn mig_capable(labels: &Labels) -> bool {
    if labels.get(VGPU_HOST_DRIVER).is_some_and(|v| !v.is_empty()) {
        return false;
    }
    if let Some(v) = labels.get(MIG_CAPABLE) {
        return v == "true";
    }
    labels.get(PRODUCT).is_some_and(|p| {
        let p = p.to_ascii_lowercase();
        p.contains("h100") || p.contains("a100") || p.contains("a30")
    })
}

/// `getWorkloadConfig`: container without sandbox workloads; else the node's valid label, else
/// the default workload, else container.
pub fn workload(labels: &Labels, sandbox: &Sandbox) -> Workload {
    if !sandbox.enabled {
        return Workload::Container;
    }
    labels
        .get(WORKLOAD)
        .and_then(|v| Workload::parse(v))
        .or(sandbox.default_workload)
        .unwrap_or(Workload::Container)
}

/// One labelling pass of the operator over a node (`labelGPUNodes`), as this era does it.
pub fn labelling_pass(before: &Labels, era: Era, sandbox: &Sandbox, stack: Stack) -> Pass {
    let plan = Plan::new(before, has_nfd_gpu(before), era, sandbox, stack);
    let mut labels = before.clone();
    if let Some(v) = plan.present {
        labels.insert(GPU_PRESENT_KEY.to_owned(), v.to_owned());
    }
    labels.retain(|k, _| Operand::from_key(k).is_none_or(|op| !plan.sweep.contains(op)));
    for op in plan.added(before) {
        labels.insert(op.key().to_owned(), "true".to_owned());
    }
    let actions = label_actions(before, &labels, era, plan.applied.is_some());
    Pass {
        labels,
        actions,
        workload: plan.workload,
        operands_disabled: plan.operands_disabled,
        applied: plan.applied,
    }
}

/// What the pass did to each deploy label present before or after it (`operands` aside).
fn label_actions(
    before: &Labels,
    after: &Labels,
    era: Era,
    applied: bool,
) -> BTreeMap<String, LabelAction> {
    let managed = managed(era);
    let mut actions = BTreeMap::new();
    for (k, old) in deploy_labels(before).filter(|(k, _)| k.as_str() != OPERANDS_KEY) {
        let action = match after.get(k) {
            None => LabelAction::Sweep,
            Some(new) if new != old => LabelAction::Add,
            Some(_) => match restored_value(old) {
                Some(to) => LabelAction::RestoreFromPaused { to },
                None if applied && Operand::from_key(k).is_some_and(|op| managed.contains(op)) => {
                    LabelAction::Keep
                }
                None => LabelAction::Untouched,
            },
        };
        actions.insert(k.clone(), action);
    }
    for (k, _) in deploy_labels(after).filter(|(k, _)| k.as_str() != OPERANDS_KEY) {
        if !before.contains_key(k) {
            actions.insert(k.clone(), LabelAction::Add);
        }
    }
    actions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::operands::DEPLOY_PREFIX;
    use Operand::*;

    // The label sets of `docs/gpu-operator.md` §3, written out here apart from the table they
    // are derived from.
    const CONTAINER: OperandSet = OperandSet::of(&[
        Driver,
        GpuFeatureDiscovery,
        ContainerToolkit,
        DevicePlugin,
        Dcgm,
        DcgmExporter,
        NodeStatusExporter,
        OperatorValidator,
    ]);
    const PASSTHROUGH: OperandSet = OperandSet::of(&[
        SandboxDevicePlugin,
        SandboxValidator,
        VfioManager,
        KataManager,
        CcManager,
    ]);
    const VGPU: OperandSet = OperandSet::of(&[
        SandboxDevicePlugin,
        VgpuManager,
        VgpuDeviceManager,
        SandboxValidator,
        CcManager,
    ]);
    const DRA: OperandSet =
        OperandSet::of(&[Driver, DraDriver, DraValidator, DcgmDra, DcgmExporterDra]);

    fn labels(items: &[&str]) -> Labels {
        items
            .iter()
            .map(|it| {
                let (k, v) = it.split_once('=').unwrap();
                let k = if k.contains('/') {
                    k.to_owned()
                } else {
                    key(k)
                };
                (k, v.to_owned())
            })
            .collect()
    }

    fn key(suffix: &str) -> String {
        format!("{DEPLOY_PREFIX}{suffix}")
    }

    fn gpu(set: OperandSet, extra: &[&str]) -> Labels {
        let mut l = labels(&["nvidia.com/gpu.present=true"]);
        for op in set.iter() {
            l.insert(op.key().to_owned(), "true".into());
        }
        l.extend(labels(extra));
        l
    }

    const NFD: &str = "feature.node.kubernetes.io/pci-10de.present=true";

    fn deploy_only(l: &Labels) -> Labels {
        l.iter()
            .filter(|(k, _)| k.starts_with(DEPLOY_PREFIX) || *k == GPU_PRESENT_KEY)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn pass(before: &[&str], era: Era, sandbox: &Sandbox) -> Labels {
        deploy_only(&labelling_pass(&labels(before), era, sandbox, Stack::ClusterPolicy).labels)
    }

    const OFF: Sandbox = Sandbox {
        enabled: false,
        default_workload: None,
        mode: SandboxMode::KubeVirt,
    };
    fn on(default: Option<Workload>, mode: SandboxMode) -> Sandbox {
        Sandbox {
            enabled: true,
            default_workload: default,
            mode,
        }
    }

    #[test]
    fn label_sets_and_sweeps_per_era_are_the_docs_ones() {
        for era in Era::ALL {
            for mode in SandboxMode::ALL {
                for w in Workload::ALL {
                    let mut want = match w {
                        Workload::Container => CONTAINER,
                        Workload::VmPassthrough => PASSTHROUGH,
                        Workload::VmVgpu => VGPU,
                    };
                    if era >= Era::V26_3
                        && w == Workload::VmPassthrough
                        && mode == SandboxMode::Kata
                    {
                        want.remove(SandboxDevicePlugin);
                        want.insert(KataSandboxDevicePlugin);
                    }
                    if era >= Era::V26_7 {
                        want.insert(Client);
                    }
                    // v22.9 – v23.3 (NVIDIA/gpu-operator v23.3.2
                    // controllers/state_manager.go, gpuStateLabels): no kata manager, no
                    // confidential-computing manager.
                    if era == Era::V23_3 {
                        want.remove(KataManager);
                        want.remove(CcManager);
                    }
                    assert_eq!(label_set(era, w, mode), want, "{era:?} {w:?} {mode:?}");
                }
            }
            let mut want = CONTAINER
                .union(PASSTHROUGH)
                .union(VGPU)
                .union(OperandSet::of(&[MigManager]));
            if era >= Era::V26_3 {
                want.insert(KataSandboxDevicePlugin);
            }
            if era >= Era::V26_7 {
                want = want.union(DRA).union(OperandSet::of(&[Client]));
            }
            if era == Era::V23_3 {
                want.remove(KataManager);
                want.remove(CcManager);
            }
            assert_eq!(managed(era), want, "{era:?}");
            assert_eq!(mig_labelled(era), OperandSet::of(&[MigManager]));
        }
    }

    #[test]
    fn new_gpu_node_gets_the_container_set() {
        let want = gpu(CONTAINER, &[]);
        assert_eq!(pass(&[NFD], Era::V24_9, &OFF), want);
        assert_eq!(pass(&[NFD], Era::V26_3, &OFF), want);
        let mut v267 = want.clone();
        v267.insert(key("client"), "true".into());
        assert_eq!(pass(&[NFD], Era::V26_7, &OFF), v267);
    }

    #[test]
    fn mig_manager_on_mig_capable_container_nodes_only() {
        let mig = gpu(CONTAINER, &["mig-manager=true"]);
        assert_eq!(
            pass(&[NFD, "nvidia.com/mig.capable=true"], Era::V24_9, &OFF),
            mig
        );
        assert_eq!(
            pass(
                &[NFD, "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB"],
                Era::V24_9,
                &OFF
            ),
            mig
        );
        assert_eq!(
            pass(
                &[NFD, "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3"],
                Era::V24_9,
                &OFF
            ),
            mig
        );
        let plain = gpu(CONTAINER, &[]);
        assert_eq!(
            pass(
                &[
                    NFD,
                    "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB",
                    "nvidia.com/mig.capable=false"
                ],
                Era::V24_9,
                &OFF
            ),
            plain
        );
        assert_eq!(
            pass(
                &[
                    NFD,
                    "nvidia.com/mig.capable=true",
                    "nvidia.com/vgpu.host-driver-version=550.90.05"
                ],
                Era::V24_9,
                &OFF
            ),
            plain
        );
        // Kept whatever its value, never swept on a container node.
        assert_eq!(
            pass(
                &[NFD, "mig-manager=false", "nvidia.com/mig.capable=true"],
                Era::V24_9,
                &OFF
            ),
            gpu(CONTAINER, &["mig-manager=false"])
        );
        assert_eq!(
            pass(&[NFD, "mig-manager=true"], Era::V26_7, &OFF)[&key("mig-manager")],
            "true"
        );
        // Swept on other workloads.
        let s = on(None, SandboxMode::KubeVirt);
        assert_eq!(
            pass(
                &[
                    NFD,
                    "mig-manager=true",
                    "nvidia.com/gpu.workload.config=vm-vgpu"
                ],
                Era::V24_9,
                &s
            ),
            gpu(VGPU, &[])
        );
    }

    #[test]
    fn values_are_kept_and_empty_ones_reset_from_v26_7() {
        let before = [
            NFD,
            "device-plugin=false",
            "dcgm=",
            "nvsm=",
            "client=true",
            "dcgm-exporter=paused-for-mig-change",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            gpu(
                CONTAINER,
                &[
                    "device-plugin=false",
                    "dcgm=",
                    "nvsm=",
                    "client=true",
                    "dcgm-exporter=paused-for-mig-change"
                ]
            )
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            gpu(
                CONTAINER,
                &[
                    "device-plugin=false",
                    "nvsm=",
                    "client=true",
                    "dcgm-exporter=paused-for-mig-change"
                ]
            )
        );
    }

    #[test]
    fn operands_false_deletes_the_operators_keys_only() {
        let before = [
            NFD,
            "operands=false",
            "device-plugin=false",
            "nvsm=true",
            "client=true",
            "mig-manager=true",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            labels(&[
                "nvidia.com/gpu.present=true",
                "operands=false",
                "nvsm=true",
                "client=true"
            ])
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            labels(&["nvidia.com/gpu.present=true", "operands=false", "nvsm=true"])
        );
        // Any other value counts as enabled.
        assert_eq!(
            pass(&[NFD, "operands=False"], Era::V24_9, &OFF),
            gpu(CONTAINER, &["operands=False"])
        );
    }

    #[test]
    fn gpu_present_without_nfd_flips_and_sweeps() {
        let before = [
            "nvidia.com/gpu.present=true",
            "device-plugin=true",
            "nvsm=true",
        ];
        assert_eq!(
            pass(&before, Era::V24_9, &OFF),
            labels(&["nvidia.com/gpu.present=false", "nvsm=true"])
        );
    }

    #[test]
    fn non_gpu_nodes_are_swept_from_v26_7_only() {
        let before = ["device-plugin=true", "nvsm=true"];
        assert_eq!(pass(&before, Era::V26_3, &OFF), labels(&before));
        assert_eq!(pass(&before, Era::V26_7, &OFF), labels(&["nvsm=true"]));
    }

    #[test]
    fn workloads_replace_the_set() {
        let s = on(None, SandboxMode::KubeVirt);
        let pt = [
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "device-plugin=false",
            "dcgm=true",
        ];
        assert_eq!(pass(&pt, Era::V24_9, &s), gpu(PASSTHROUGH, &[]));
        assert_eq!(
            pass(&pt, Era::V24_9, &OFF),
            gpu(CONTAINER, &["device-plugin=false"])
        );
        let vg = [NFD, "nvidia.com/gpu.workload.config=vm-vgpu"];
        assert_eq!(pass(&vg, Era::V24_9, &s), gpu(VGPU, &[]));
        // Invalid or missing: the default workload.
        let bogus = [NFD, "nvidia.com/gpu.workload.config=bogus"];
        assert_eq!(pass(&bogus, Era::V24_9, &s), gpu(CONTAINER, &[]));
        let d = on(Some(Workload::VmVgpu), SandboxMode::KubeVirt);
        assert_eq!(pass(&bogus, Era::V24_9, &d), gpu(VGPU, &[]));
        assert_eq!(pass(&[NFD], Era::V24_9, &d), gpu(VGPU, &[]));
    }

    #[test]
    fn kata_mode_swaps_the_passthrough_device_plugin_from_v26_3() {
        let k = on(None, SandboxMode::Kata);
        let pt = [
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "sandbox-device-plugin=true",
        ];
        let mut want = gpu(PASSTHROUGH, &["kata-sandbox-device-plugin=true"]);
        want.remove(&key("sandbox-device-plugin"));
        assert_eq!(pass(&pt, Era::V26_3, &k), want);
        assert_eq!(pass(&pt, Era::V24_9, &k), gpu(PASSTHROUGH, &[]));
        // vm-vgpu keeps the kubevirt plugin's label in kata mode.
        let vg = [NFD, "nvidia.com/gpu.workload.config=vm-vgpu"];
        assert_eq!(pass(&vg, Era::V26_3, &k), gpu(VGPU, &[]));
        // The kata key is swept from container nodes from v26.3 only.
        let c = [NFD, "kata-sandbox-device-plugin=true"];
        assert_eq!(pass(&c, Era::V26_3, &OFF), gpu(CONTAINER, &[]));
        assert_eq!(
            pass(&c, Era::V24_9, &OFF),
            gpu(CONTAINER, &["kata-sandbox-device-plugin=true"])
        );
    }

    #[test]
    fn dra_keys_are_swept_from_v26_7() {
        let before = [NFD, "dra-driver=true", "dcgm-dra=true"];
        assert_eq!(
            pass(&before, Era::V26_3, &OFF),
            gpu(CONTAINER, &["dra-driver=true", "dcgm-dra=true"])
        );
        assert_eq!(
            pass(&before, Era::V26_7, &OFF),
            gpu(CONTAINER, &["client=true"])
        );
    }

    /// The GPUCluster (DRA) stack's pass, as gpu-operator@v26.7.0 `updateGPUStateLabels` does
    /// it: a GPU node gets the five DRA-stack keys (absent or empty) and loses every key of the
    /// device-plugin stack but vgpu-manager, whatever the value; operands=false is not read;
    /// nvsm and unknown keys stay; a node without an NFD GPU label loses them all.
    #[test]
    fn the_gpu_cluster_stack_labels_its_own_keys_and_sweeps_the_device_plugin_stack() {
        let gc = |before: &[&str]| {
            deploy_only(
                &labelling_pass(&labels(before), Era::V26_7, &OFF, Stack::GpuCluster).labels,
            )
        };
        let dra = OperandSet::of(&[
            Operand::Driver,
            Operand::DraDriver,
            Operand::DraValidator,
            Operand::DcgmDra,
            Operand::DcgmExporterDra,
        ]);
        let (set, sweep) = gpu_cluster_labels(Era::V26_7);
        assert_eq!(set, dra);
        let device_plugin_only: Vec<&str> = sweep.iter().map(Operand::name).collect();
        assert_eq!(
            device_plugin_only,
            [
                "container-toolkit",
                "operator-validator",
                "device-plugin",
                "gpu-feature-discovery",
                "dcgm",
                "dcgm-exporter",
                "node-status-exporter",
                "mig-manager",
                "sandbox-device-plugin",
                "kata-sandbox-device-plugin",
                "sandbox-validator",
                "vfio-manager",
                "vgpu-device-manager",
                "cc-manager",
                "kata-manager",
                "client",
            ]
        );
        let before = [
            NFD,
            "container-toolkit=true",
            "device-plugin=false",
            "sandbox-validator=true",
            "vgpu-manager=false",
            "nvsm=true",
            "dra-driver=",
            "dcgm-dra=false",
            "nvidia.com/gpu.deploy.custom=true",
        ];
        assert_eq!(
            gc(&before),
            gpu(
                dra,
                &[
                    "vgpu-manager=false",
                    "nvsm=true",
                    "dcgm-dra=false",
                    "nvidia.com/gpu.deploy.custom=true"
                ]
            )
        );
        // operands=false is not read on this stack: the DRA keys are still added.
        let off = gc(&[NFD, "nvidia.com/gpu.deploy.operands=false"]);
        assert_eq!(
            off.get(&key("dra-driver")).map(String::as_str),
            Some("true")
        );
        let p = labelling_pass(
            &labels(&[NFD, "nvidia.com/gpu.deploy.operands=false"]),
            Era::V26_7,
            &OFF,
            Stack::GpuCluster,
        );
        assert!(!p.operands_disabled);
        assert_eq!(p.applied, Some(Stack::GpuCluster));
        assert_eq!(p.workload, None);
        // No NFD label: gpu.present flips and every state key goes.
        let gone = gc(&[
            "nvidia.com/gpu.present=true",
            "dra-driver=true",
            "vgpu-manager=true",
        ]);
        assert_eq!(gone, labels(&["nvidia.com/gpu.present=false"]));
        // Before v26.7 there is no GPUCluster: the ClusterPolicy's pass.
        assert_eq!(
            deploy_only(
                &labelling_pass(&labels(&[NFD]), Era::V26_3, &OFF, Stack::GpuCluster).labels
            ),
            gpu(CONTAINER, &[])
        );
        // Both custom resources: the operator labels nothing.
        let both = labels(&["nvidia.com/gpu.present=true", "device-plugin=true"]);
        let p = labelling_pass(&both, Era::V26_7, &OFF, Stack::Both);
        assert_eq!(p.labels, both);
        assert_eq!(p.applied, None);
    }

    #[test]
    fn actions_name_what_happens_to_each_label() {
        let s = on(None, SandboxMode::KubeVirt);
        let before = labels(&[
            NFD,
            "nvidia.com/gpu.workload.config=vm-passthrough",
            "device-plugin=false",
            "vfio-manager=false",
            "sandbox-validator=paused-for-driver-upgrade",
            "nvsm=",
        ]);
        let p = labelling_pass(&before, Era::V24_9, &s, Stack::ClusterPolicy);
        assert_eq!(p.workload, Some(Workload::VmPassthrough));
        assert_eq!(p.actions[&key("device-plugin")], LabelAction::Sweep);
        assert_eq!(p.actions[&key("vfio-manager")], LabelAction::Keep);
        assert_eq!(p.actions[&key("cc-manager")], LabelAction::Add);
        assert_eq!(
            p.actions[&key("sandbox-validator")],
            LabelAction::RestoreFromPaused { to: "true".into() }
        );
        assert_eq!(p.actions[&key("nvsm")], LabelAction::Untouched);
        // v26.7 resets an empty value: an add.
        let e = labelling_pass(
            &labels(&[NFD, "dcgm="]),
            Era::V26_7,
            &OFF,
            Stack::ClusterPolicy,
        );
        assert_eq!(e.actions[&key("dcgm")], LabelAction::Add);
    }
}
