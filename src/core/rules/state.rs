//! The state rules: what the DaemonSet controller will run on the node.

use super::{Change, Ctx, Found, Rule};
use crate::core::operands::{GPU_PRESENT_KEY, Labels, Operand, OperandSet, Wait, is_gpu_node};

impl Ctx<'_, '_> {
    pub(super) fn device_plugin_without_toolkit(&self, out: &mut Vec<Found>) {
        let broken =
            |set: OperandSet| set.contains(Operand::DevicePlugin) && !self.toolkit_provided(set);
        if !broken(self.after) {
            return;
        }
        let node = self.node();
        let toolkit = Operand::ContainerToolkit.key();
        let plugin = Operand::DevicePlugin.key();
        let change = self.change(broken(self.before));
        let (message, warning) = match change {
            Change::Existing => (
                format!(
                    "node {node} already runs the NVIDIA device plugin without the container toolkit ({}){}: \
                     set {toolkit}=true or {plugin}=false to repair the node.",
                    self.label_state(toolkit),
                    self.unchanged()
                ),
                format!("{node} is already broken: device-plugin runs without container-toolkit"),
            ),
            Change::New => {
                let toolkit_was_on = self.old_value(toolkit) == Some("true");
                let fix = if toolkit_was_on {
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
                        self.label_state(toolkit)
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
        let after = stranded(self.after);
        let before = stranded(self.before);
        self.per_subset(out, Rule::OperandWithoutToolkit, after, before, |names, change| {
            let node = self.node();
            let toolkit = Operand::ContainerToolkit.key();
            match change {
                Change::New => (
                    format!(
                        "node {node}: {names} would run without the container toolkit ({}) and wait for it forever; \
                         set {toolkit}=true or turn them off.",
                        self.label_state(toolkit)
                    ),
                    format!("{node}: {names} would hang without container-toolkit"),
                ),
                Change::Existing => (
                    format!(
                        "node {node} already runs {names} without the container toolkit ({}){}.",
                        self.label_state(toolkit),
                        self.unchanged()
                    ),
                    format!("{node}: {names} already wait for container-toolkit"),
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
            waiting(Some(self.review.labels), self.after),
            waiting(self.review.old_labels, self.before),
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
                     for its toolkit-ready check; set {key}=true."
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
                         vgpu-manager-ready); set {key}=true."
                    ),
                    format!(
                        "{node}: {} {already}hang: sandbox-validator={value:?}",
                        short_list(names)
                    ),
                )
            },
        );
    }

    /// The sandbox validator's first step, cc-manager validation, waits forever on a
    /// `nvidia.com/cc.capable=true` node for the cc-manager's ready file when no cc-manager runs
    /// there although the ClusterPolicy switches it on (the step is dropped only when it is
    /// off): its label is not `true`, or v26.3+ does not deploy it in `kubevirt` mode. The
    /// later steps, and every operand waiting for the validator's files, wait with it
    /// (gpu-operator v24.9.0 – v26.7.0 `assets/state-sandbox-validation/0500_daemonset.yaml`,
    /// `CCManager.runValidation`; `docs/gpu-operator-pass3.md` §6).
    pub(super) fn operand_behind_the_cc_manager_step(&self, out: &mut Vec<Found>) {
        if self.facts.disabled.contains(Operand::CcManager) {
            return;
        }
        let cc = crate::core::operands::CC_CAPABLE_KEY;
        let stuck = |labels: Option<&Labels>, set: OperandSet| -> OperandSet {
            match labels {
                Some(labels)
                    if labels.get(cc).is_some_and(|v| v == "true")
                        && set.contains(Operand::SandboxValidator)
                        && !set.contains(Operand::CcManager) =>
                {
                    set.iter()
                        .filter(|op| op.waits_for(Wait::SandboxValidator))
                        .collect()
                }
                _ => OperandSet::EMPTY,
            }
        };
        let after = stuck(Some(self.review.labels), self.after);
        let before = stuck(self.review.old_labels, self.before);
        let key = Operand::CcManager.key();
        let state = self.label_state(key);
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
                        "node {node}: {cc}=true and the ClusterPolicy switches the cc-manager on, but no \
                         cc-manager runs here ({state}), so the sandbox validator's cc-manager step waits \
                         for it forever and {names} {already}wait forever behind it; set {key}=true, or \
                         switch spec.ccManager.enabled off."
                    ),
                    format!(
                        "{node}: {} {already}hang: the sandbox validator waits for a cc-manager that does not run",
                        short_list(names)
                    ),
                )
            },
        );
    }

    pub(super) fn device_plugin_on_non_gpu_node(&self, out: &mut Vec<Found>) {
        let misplaced = |labels: &Labels, set: OperandSet| {
            set.contains(Operand::DevicePlugin) && !is_gpu_node(labels)
        };
        if !misplaced(self.review.labels, self.after) {
            return;
        }
        let before = self
            .review
            .old_labels
            .is_some_and(|old| misplaced(old, self.before));
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
