//! The state rules: what the DaemonSet controller will run on the node.

use super::{Change, Ctx, Found, Rule};
use crate::core::facts::ClusterFacts;
use crate::core::operands::{
    CC_CAPABLE_KEY, GPU_PRESENT_KEY, Labels, NFD_NVIDIA_PCI_KEYS, Operand, OperandSet, Wait,
    Workload, is_gpu_node,
};
use crate::core::operator::{has_nfd_gpu, workload};
use crate::core::pauses::{paused_by, wait_for_pause};

impl Ctx<'_, '_> {
    pub(super) fn device_plugin_without_toolkit(&self, out: &mut Vec<Found>) {
        let broken =
            |set: OperandSet| set.contains(Operand::DevicePlugin) && !self.toolkit_provided(set);
        if !broken(self.after.set) {
            return;
        }
        let node = self.node();
        let toolkit = Operand::ContainerToolkit.key();
        let plugin = Operand::DevicePlugin.key();
        let change = self.change(broken(self.before.set));
        let (message, warning) = match change {
            Change::Existing => (
                format!(
                    "node {node} already runs the NVIDIA device plugin without the container toolkit ({}){}: \
                     set {toolkit}=true or {plugin}=false to repair the node.",
                    self.operand_state(Operand::ContainerToolkit),
                    self.unchanged()
                ),
                format!("{node} is already broken: device-plugin runs without container-toolkit"),
            ),
            Change::New => {
                let toolkit_was_on = self.old_value(toolkit) == Some("true");
                let taint = self
                    .after
                    .blocked
                    .get(&Operand::ContainerToolkit)
                    .and_then(|p| p.taint());
                // Paused before the request and left so: the pausing component's; a pause value
                // the request writes itself is a person's, and gets the usual advice.
                let paused = self
                    .new_value(toolkit)
                    .filter(|v| self.old_value(toolkit) == Some(*v))
                    .and_then(|v| paused_by(v).map(|p| (p, v)));
                let fix = if let Some((pauser, value)) = paused {
                    format!(
                        "{}; until then leave {plugin} paused too (or false)",
                        wait_for_pause(pauser, toolkit, value)
                    )
                } else if let Some(taint) = taint {
                    format!(
                        "do not taint the node with {taint}, or tolerate it in the container toolkit's DaemonSet \
                         too (the ClusterPolicy's spec.daemonsets.tolerations)"
                    )
                } else if toolkit_was_on {
                    format!(
                        "keep {toolkit}=true, or turn the device plugin off in the same command with {plugin}=false"
                    )
                } else {
                    format!(
                        "set {toolkit}=true in the same command, or leave the device plugin off ({plugin}=false)"
                    )
                };
                (
                    format!(
                        "node {node}: {} would run the NVIDIA device plugin without the container toolkit ({}), \
                         so GPU pods would be scheduled there and fail to start; {fix}.",
                        self.selector_words(Operand::DevicePlugin),
                        self.operand_state(Operand::ContainerToolkit)
                    ),
                    format!(
                        "{node}: device-plugin would run without container-toolkit; GPU pods would fail to start"
                    ),
                )
            }
        };
        out.push(Found {
            rule: Rule::DevicePluginWithoutToolkit,
            change,
            message,
            warning,
        });
    }

    pub(super) fn operand_without_toolkit(&self, out: &mut Vec<Found>) {
        let stranded = |set: OperandSet| -> OperandSet {
            if self.toolkit_provided(set) {
                return OperandSet::EMPTY;
            }
            // The device plugin waits for the toolkit too, but has a rule of its own.
            set.iter()
                .filter(|op| *op != Operand::DevicePlugin && op.waits_for(Wait::Toolkit))
                .collect()
        };
        let after = stranded(self.after.set);
        let before = stranded(self.before.set);
        self.per_subset(out, Rule::OperandWithoutToolkit, after, before, |names, change| {
            let node = self.node();
            let toolkit = Operand::ContainerToolkit.key();
            match change {
                Change::New => (
                    format!(
                        "node {node}: {names} would run without the container toolkit ({}) and wait for it forever; \
                         set {toolkit}=true or turn them off.",
                        self.operand_state(Operand::ContainerToolkit)
                    ),
                    format!("{node}: {names} would hang without container-toolkit"),
                ),
                Change::Existing => (
                    format!(
                        "node {node} already runs {names} without the container toolkit ({}){}.",
                        self.operand_state(Operand::ContainerToolkit),
                        self.unchanged()
                    ),
                    format!("{node}: {names} already wait for container-toolkit"),
                ),
            }
        });
    }

    /// `dcgm-exporter-without-dcgm`: the exporter runs where the standalone DCGM the ClusterPolicy
    /// deploys is labelled off (an absent label the operator adds back; a paused one its
    /// component writes back).
    pub(super) fn dcgm_exporter_without_dcgm(&self, out: &mut Vec<Found>) {
        if !self.facts.standalone_dcgm() {
            return;
        }
        let key = Operand::Dcgm.key();
        let cut = |labels: Option<&Labels>, set: OperandSet| -> OperandSet {
            match labels.and_then(|l| l.get(key)) {
                Some(v)
                    if v != "true"
                        && paused_by(v).is_none()
                        && set.contains(Operand::DcgmExporter)
                        && !set.contains(Operand::Dcgm) =>
                {
                    OperandSet::of(&[Operand::DcgmExporter])
                }
                _ => OperandSet::EMPTY,
            }
        };
        let after = cut(Some(self.review.labels), self.after.set);
        let before = cut(self.review.old_labels, self.before.set);
        let value = self.new_value(key).unwrap_or_default();
        let exporter = Operand::DcgmExporter.key();
        self.per_subset(out, Rule::DcgmExporterWithoutDcgm, after, before, |_, change| {
            let node = self.node();
            match change {
                Change::New => (
                    format!(
                        "node {node}: {key}={value:?} keeps the standalone DCGM off while the DCGM exporter runs: with \
                         spec.dcgm.enabled the exporter connects to the nvidia-dcgm Service, which answers only on the \
                         same node (internalTrafficPolicy: Local), so it fails to start there and the node's GPU metrics \
                         stop (and health monitors that read them, such as NVSentinel's); set {key}=true, or turn the \
                         exporter off too ({exporter}=false)."
                    ),
                    format!("{node}: dcgm-exporter would run without dcgm ({key}={value:?})"),
                ),
                Change::Existing => (
                    format!(
                        "node {node} already runs the DCGM exporter without the standalone DCGM ({key}={value:?}){}.",
                        self.unchanged()
                    ),
                    format!("{node}: dcgm-exporter already runs without dcgm"),
                ),
            }
        });
    }

    /// The operands, after and before the request, that wait for `wait` while the validator
    /// labelled `key` is kept off, and the request's value of that label. A missing validator
    /// label is added by the operator; only an explicit non-true value keeps it away for good.
    fn waiting_on_validator(&self, key: &str, wait: Wait) -> (OperandSet, OperandSet, &str) {
        let waiting = |labels: Option<&Labels>, set: OperandSet| -> OperandSet {
            match labels {
                Some(labels) if labels.get(key).is_some_and(|v| v != "true") => {
                    set.iter().filter(|op| op.waits_for(wait)).collect()
                }
                _ => OperandSet::EMPTY,
            }
        };
        (
            waiting(Some(self.review.labels), self.after.set),
            waiting(self.review.old_labels, self.before.set),
            self.new_value(key).unwrap_or_default(),
        )
    }

    pub(super) fn operand_without_validator(&self, out: &mut Vec<Found>) {
        let key = Operand::OperatorValidator.key();
        let (after, before, value) = self.waiting_on_validator(key, Wait::ToolkitReady);
        self.per_subset(out, Rule::OperandWithoutValidator, after, before, |names, change| {
            let node = self.node();
            let already = if change == Change::Existing { "already " } else { "" };
            (
                format!(
                    "node {node}: {key}={value:?} keeps the operator validator off, so {names} {already}wait forever \
                     for its toolkit-ready check; {}.",
                    fix_for_validator(key, value, self.old_value(key) == Some(value))
                ),
                format!(
                    "{node}: {} {already}hang: operator-validator={value:?}",
                    short_list(names)
                ),
            )
        });
    }

    pub(super) fn operand_without_sandbox_validator(&self, out: &mut Vec<Found>) {
        let key = Operand::SandboxValidator.key();
        let (after, before, value) = self.waiting_on_validator(key, Wait::SandboxValidator);
        self.per_subset(
            out,
            Rule::OperandWithoutSandboxValidator,
            after,
            before,
            |names, change| {
                let node = self.node();
                let already = if change == Change::Existing { "already " } else { "" };
                (
                    format!(
                        "node {node}: {key}={value:?} keeps the sandbox validator off, so {names} {already}wait \
                         forever for its files (workload-type, vfio-pci-ready, vgpu-devices-ready, \
                         vgpu-manager-ready); {}.",
                        fix_for_validator(key, value, self.old_value(key) == Some(value))
                    ),
                    format!(
                        "{node}: {} {already}hang: sandbox-validator={value:?}",
                        short_list(names)
                    ),
                )
            },
        );
    }

    /// The sandbox validator's steps run in order (cc-manager, vfio-pci, vgpu-manager,
    /// vgpu-devices), each waiting or failing until the component it checks has done its work;
    /// a step whose component the ClusterPolicy switches on but that does not run on the node
    /// stops the validator there, and every operand waiting for the validator's files waits
    /// with it ([`StuckStep`]; gpu-operator v22.9.0 – v26.7.0
    /// `assets/state-sandbox-validation/0500_daemonset.yaml`, `validator/main.go`;
    /// `docs/gpu-operator.md` §7).
    pub(super) fn operand_behind_a_stuck_sandbox_step(&self, out: &mut Vec<Found>) {
        let after = stuck_sandbox_step(self.review.labels, self.after.set, self.facts);
        let before = self
            .review
            .old_labels
            .and_then(|old| stuck_sandbox_step(old, self.before.set, self.facts));
        let Some((step, hanging)) = after else {
            return;
        };
        let before = before.map_or(OperandSet::EMPTY, |(_, set)| set);
        let state = self.label_state(step.component().key());
        let version = &self.facts.operator.version.text;
        self.per_subset(
            out,
            Rule::OperandWithoutSandboxValidator,
            hanging,
            before,
            |names, change| {
                let node = self.node();
                let already = if change == Change::Existing {
                    "already "
                } else {
                    ""
                };
                (
                    format!(
                        "node {node}: {}",
                        step.explain(&state, names, already, version)
                    ),
                    format!(
                        "{node}: {} {already}hang: {}",
                        short_list(names),
                        step.short()
                    ),
                )
            },
        );
    }

    /// The GPUCluster stack's DRA validator, DCGM and DCGM exporter each hold an admin-access
    /// ResourceClaim of device class `gpu.nvidia.com` (gpu-operator@v26.7.0
    /// `manifests/state-dra-validation/0400_resourceclaimtemplate.yaml`,
    /// `manifests/state-dcgm/0400_resourceclaimtemplate.yaml`,
    /// `manifests/state-dcgm-exporter/0400_resourceclaimtemplate.yaml`): only the DRA kubelet
    /// plugin publishes the node's GPUs, so without it their pods are never scheduled.
    pub(super) fn operand_without_dra_driver(&self, out: &mut Vec<Found>) {
        let stranded = |set: OperandSet| -> OperandSet {
            if set.contains(Operand::DraDriver) {
                return OperandSet::EMPTY;
            }
            set.iter()
                .filter(|op| op.waits_for(Wait::DraDriver))
                .collect()
        };
        let after = stranded(self.after.set);
        let before = stranded(self.before.set);
        let key = Operand::DraDriver.key();
        let state = self.label_state(key);
        self.per_subset(out, Rule::OperandWithoutDraDriver, after, before, |names, change| {
            let node = self.node();
            let already = if change == Change::Existing { "already " } else { "" };
            (
                format!(
                    "node {node}: {names} {already}run without the DRA kubelet plugin ({state}): their pods \
                     claim the node's GPUs through a gpu.nvidia.com ResourceClaim that nothing allocates \
                     here, so they stay Pending; set {key}=true or turn them off."
                ),
                format!(
                    "{node}: {} {already}stay Pending without the DRA kubelet plugin",
                    short_list(names)
                ),
            )
        });
    }

    pub(super) fn device_plugin_on_non_gpu_node(&self, out: &mut Vec<Found>) {
        let misplaced = |labels: &Labels, set: OperandSet| {
            set.contains(Operand::DevicePlugin) && !is_gpu_node(labels)
        };
        if !misplaced(self.review.labels, self.after.set) {
            return;
        }
        let before = self
            .review
            .old_labels
            .is_some_and(|old| misplaced(old, self.before.set));
        let change = self.change(before);
        let node = self.node();
        let already = if change == Change::Existing {
            "already "
        } else {
            ""
        };
        out.push(Found {
            rule: Rule::DevicePluginOnNonGpuNode,
            change,
            message: format!(
                "node {node}: the NVIDIA device plugin {already}runs on a node without {GPU_PRESENT_KEY}=true \
                 or an NFD NVIDIA PCI label; is this the right node?"
            ),
            warning: format!("{node}: device-plugin {already}runs on a node with no NVIDIA GPU label"),
        });
    }

    /// `nfd-labels-lost`: NFD labels no NVIDIA PCI device on a node the operator counted as a
    /// GPU node (`nvidia.com/gpu.present` is set). `true`: its next labelling pass flips it to
    /// `false` and deletes every deploy label; `false`: it has done so (it writes `false` only
    /// then). gpu-operator#1469: a change of NFD's configuration tore down every operand.
    pub(super) fn nfd_labels_lost(&self, out: &mut Vec<Found>) {
        let lost = |labels: &Labels| -> Option<bool> {
            if has_nfd_gpu(labels) {
                return None;
            }
            match labels.get(GPU_PRESENT_KEY).map(String::as_str) {
                Some("true") => Some(true),
                Some("false") => Some(false),
                _ => None,
            }
        };
        let Some(present) = lost(self.review.labels) else {
            return;
        };
        let change = self.change(self.review.old_labels.and_then(lost).is_some());
        let node = self.node();
        let keys = NFD_NVIDIA_PCI_KEYS.join(", ");
        let fix = "If the node still has its GPUs, NFD's configuration lost them (nfd-worker's pci \
                   source and its deviceClassWhitelist, or a NodeFeatureRule): restore it, and the \
                   operator labels the node again.";
        let (message, warning) = if present {
            (
                format!(
                    "node {node}: NFD labels no NVIDIA PCI device on it any more (none of {keys} is true) \
                     while {GPU_PRESENT_KEY}=true: the GPU Operator's next labelling pass sets \
                     {GPU_PRESENT_KEY}=false and deletes every nvidia.com/gpu.deploy.* label, which stops the \
                     driver, the container toolkit, the device plugin and every other operand there \
                     (gpu-operator#1469){}. {fix}",
                    self.unchanged()
                ),
                format!(
                    "{node}: NFD's NVIDIA labels are gone; the operator will remove every operand"
                ),
            )
        } else {
            (
                format!(
                    "node {node}: {GPU_PRESENT_KEY}=false and no NFD NVIDIA PCI label ({keys}): the GPU \
                     Operator saw NFD's NVIDIA label go and removed every operand from the node \
                     (gpu-operator#1469){}. {fix}",
                    self.unchanged()
                ),
                format!(
                    "{node}: NFD's NVIDIA labels are gone and the operator removed every operand"
                ),
            )
        };
        out.push(Found {
            rule: Rule::NfdLabelsLost,
            change,
            message,
            warning,
        });
    }
}

/// A step of the sandbox validator that never passes on a node, because the component it
/// checks does not run there although the ClusterPolicy deploys it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum StuckStep {
    /// `cc-manager-validation` on a `nvidia.com/cc.capable=true` node waits forever for the
    /// cc-manager's ready file (`CCManager.runValidation`). The step exists from v23.6 and is
    /// dropped only when `spec.ccManager.enabled` is false (`TransformValidatorComponent`), so a
    /// cc-manager labelled off, or not deployed in v26.3+ `kubevirt` mode, leaves it waiting.
    CcManager,
    /// `vfio-pci-validation` on a vm-passthrough node fails, and the kubelet restarts it for
    /// ever, until every NVIDIA GPU is bound to `vfio-pci` (`VfioPCI.runValidation`), which the
    /// vfio-manager does.
    VfioPci,
    /// `vgpu-manager-validation` on a vm-vgpu node waits forever for `nvidia-smi` of a vGPU
    /// manager (`VGPUManager.runValidation`): the operator's, or one on the host.
    VgpuManager,
    /// `vgpu-devices-validation` on a vm-vgpu node waits forever for a vGPU (mdev) device
    /// (`VGPUDevices.runValidation`), which the vGPU device manager creates.
    VgpuDevices,
    /// Before v26.7 the vGPU device manager's init container waits only for
    /// `vgpu-manager-ready`, which the validator writes for the operator's vGPU manager; for
    /// one installed on the host it writes `host-vgpu-manager-ready`
    /// (`assets/state-vgpu-device-manager/0600_daemonset.yaml`; `VGPUManager.validate`). With no
    /// operator vGPU manager on the node, the device manager never starts, and the
    /// vgpu-devices step waits for the devices it would create.
    HostVgpuManager,
}

impl StuckStep {
    /// The component whose absence stops the step.
    fn component(self) -> Operand {
        match self {
            StuckStep::CcManager => Operand::CcManager,
            StuckStep::VfioPci => Operand::VfioManager,
            StuckStep::VgpuManager | StuckStep::HostVgpuManager => Operand::VgpuManager,
            StuckStep::VgpuDevices => Operand::VgpuDeviceManager,
        }
    }

    fn explain(self, state: &str, names: &str, already: &str, version: &str) -> String {
        let key = self.component().key();
        match self {
            StuckStep::CcManager => format!(
                "{CC_CAPABLE_KEY}=true and the ClusterPolicy switches the cc-manager on, but no \
                 cc-manager runs here ({state}), so the sandbox validator's cc-manager step waits \
                 for it forever and {names} {already}wait forever behind it; set {key}=true, or \
                 switch spec.ccManager.enabled off."
            ),
            StuckStep::VfioPci => format!(
                "a vm-passthrough node, and the ClusterPolicy leaves binding its GPUs to vfio-pci to \
                 the vfio-manager, but none runs here ({state}), so the sandbox validator's vfio-pci \
                 step fails and restarts for ever (unless the GPUs were bound to vfio-pci by other \
                 means) and {names} {already}wait forever for vfio-pci-ready; set {key}=true."
            ),
            StuckStep::VgpuManager => format!(
                "a vm-vgpu node, and the ClusterPolicy deploys the vGPU manager, but none runs here \
                 ({state}), so the sandbox validator's vgpu-manager step waits forever for a vGPU \
                 driver (unless the host has one installed) and {names} {already}wait forever behind \
                 it; set {key}=true."
            ),
            StuckStep::VgpuDevices => format!(
                "a vm-vgpu node, and the ClusterPolicy deploys the vGPU device manager, but none runs \
                 here ({state}), so the sandbox validator's vgpu-devices step waits forever for vGPU \
                 devices (unless they were created by other means) and {names} {already}wait forever \
                 for vgpu-devices-ready; set {key}=true."
            ),
            StuckStep::HostVgpuManager => format!(
                "a vm-vgpu node with no vGPU manager of the operator ({state}); the vGPU device \
                 manager of GPU Operator {version} waits only for vgpu-manager-ready, which the \
                 validator writes for the operator's vGPU manager (a host-installed one gets \
                 host-vgpu-manager-ready), so it never starts, the sandbox validator's vgpu-devices \
                 step waits forever for the devices it would create, and {names} {already}wait \
                 forever; set {key}=true (the operator's vGPU manager), or use v26.7, whose device \
                 manager accepts a host-installed one."
            ),
        }
    }

    fn short(self) -> &'static str {
        match self {
            StuckStep::CcManager => {
                "the sandbox validator waits for a cc-manager that does not run"
            }
            StuckStep::VfioPci => "the sandbox validator's vfio-pci step fails: no vfio-manager",
            StuckStep::VgpuManager => {
                "the sandbox validator waits for a vGPU manager that does not run"
            }
            StuckStep::VgpuDevices => {
                "the sandbox validator waits for vGPU devices: no vgpu-device-manager"
            }
            StuckStep::HostVgpuManager => {
                "vgpu-device-manager waits for vgpu-manager-ready: no operator vGPU manager"
            }
        }
    }
}

/// The first sandbox-validator step that never passes on a node with these labels running
/// `set`, and the operands that hang behind it (`None`: the sandbox validator does not run,
/// or no step is stuck). A component switched off in the ClusterPolicy is one the person
/// provides by other means (GPUs bound by hand, a host vGPU manager, devices created by hand),
/// so only one switched on and not running stops a step; the cc-manager step is the
/// exception only in that switching it off drops it.
fn stuck_sandbox_step(
    labels: &Labels,
    set: OperandSet,
    facts: &ClusterFacts,
) -> Option<(StuckStep, OperandSet)> {
    if !set.contains(Operand::SandboxValidator) {
        return None;
    }
    let era = facts.operator.era();
    let switched_on = |op: Operand| !facts.disabled.contains(op) && era >= op.info().since;
    let missing = |op: Operand| switched_on(op) && !set.contains(op);
    let workload = workload(labels, &facts.sandbox);
    let cc_capable = labels.get(CC_CAPABLE_KEY).is_some_and(|v| v == "true");
    let step = if cc_capable && missing(Operand::CcManager) {
        StuckStep::CcManager
    } else if workload == Workload::VmPassthrough && missing(Operand::VfioManager) {
        StuckStep::VfioPci
    } else if workload == Workload::VmVgpu && missing(Operand::VgpuManager) {
        StuckStep::VgpuManager
    } else if workload == Workload::VmVgpu && missing(Operand::VgpuDeviceManager) {
        StuckStep::VgpuDevices
    } else if workload == Workload::VmVgpu
        && era.vgpu_device_manager_needs_operator_vgpu_manager()
        && set.contains(Operand::VgpuDeviceManager)
        && !set.contains(Operand::VgpuManager)
    {
        StuckStep::HostVgpuManager
    } else {
        return None;
    };
    let hanging: OperandSet = set
        .iter()
        .filter(|op| op.waits_for(Wait::SandboxValidator))
        .collect();
    (!hanging.is_empty()).then_some((step, hanging))
}

/// A list of operand names short enough for a kubectl warning line: more than three become
/// a count (the full list is in the finding's message).
fn short_list(names: &str) -> String {
    let n = names.split(", ").count();
    if n > 3 {
        format!("{n} operands")
    } else {
        names.to_owned()
    }
}

/// How to bring a validator labelled off back: `true`, unless its label is a pause the request
/// left as it was (`kept`), which the pausing component writes back itself.
fn fix_for_validator(key: &str, value: &str, kept: bool) -> String {
    match paused_by(value).filter(|_| kept) {
        Some(pauser) => wait_for_pause(pauser, key, value),
        None => format!("set {key}=true"),
    }
}
