//! The rule on device-plugin DaemonSets the GPU Operator does not own ([`crate::core::foreign`]):
//! a state rule, judged on where their placement puts them with the node's labels and taints.

use super::{Change, Ctx, Found, Rule};
use crate::core::foreign::ForeignPlugin;
use crate::core::operands::{Labels, Operand, OperandSet, is_gpu_node};
use crate::core::placement::NodePlacement;
use crate::core::seen::Seen;

/// What a foreign plugin on a node breaks.
#[derive(Copy, Clone, PartialEq, Eq)]
enum Clash {
    /// The operator's device plugin runs there too.
    Twice,
    /// No container toolkit runs there.
    NoToolkit,
}

impl Ctx<'_, '_> {
    /// `foreign-device-plugin`: a device-plugin DaemonSet outside the operator's namespace
    /// runs on the node beside the operator's device plugin, or without its container toolkit.
    pub(super) fn foreign_device_plugin(&self, out: &mut Vec<Found>) {
        let plugins = match &self.facts.foreign_plugins {
            Seen::NotRead => return,
            Seen::Known(plugins) => plugins,
            Seen::Unknown(why) => return self.foreign_plugins_unknown(why, out),
        };
        let node = self.review.node;
        let clash = |labels: &Labels, placement: &NodePlacement, set: OperandSet| {
            let running: Vec<&ForeignPlugin> = plugins
                .iter()
                .filter(|p| p.runs_on(node, labels, placement))
                .collect();
            let clash = if running.is_empty() {
                None
            } else if set.contains(Operand::DevicePlugin) {
                Some(Clash::Twice)
            } else if !self.toolkit_provided(set) {
                Some(Clash::NoToolkit)
            } else {
                None
            };
            clash.map(|c| (c, running))
        };
        let Some((what, running)) =
            clash(self.review.labels, self.review.placement, self.after.set)
        else {
            return;
        };
        let before = self.review.old_labels.and_then(|old| {
            let placement = self.review.old_placement.unwrap_or(self.review.placement);
            clash(old, placement, self.before.set)
        });
        let change = self.change(before.is_some_and(|(c, _)| c == what));
        let names: Vec<String> = running.iter().map(|p| p.id()).collect();
        let names = names.join(", ");
        let node = self.node();
        let already = if change == Change::Existing {
            "already "
        } else {
            ""
        };
        let (message, warning) = match what {
            Clash::Twice => (
                format!(
                    "node {node}: the device plugin DaemonSet {names}, not the GPU Operator's, \
                     {already}runs there beside the operator's device plugin: two plugins register \
                     nvidia.com/gpu with the kubelet, which keeps whichever registered last \
                     (NVIDIA/gpu-operator#1704). Keep one: set {}=false on this node, or narrow \
                     that DaemonSet's nodeSelector{}.",
                    Operand::DevicePlugin.key(),
                    self.unchanged()
                ),
                format!("{node}: device plugin {names} {already}runs beside the operator's"),
            ),
            Clash::NoToolkit => (
                format!(
                    "node {node}: the device plugin DaemonSet {names}, not the GPU Operator's, \
                     {already}runs there without the operator's container toolkit, so GPU pods \
                     scheduled there fail to start{}. Set {}=true, or keep that DaemonSet off \
                     this node.",
                    self.unchanged(),
                    Operand::ContainerToolkit.key()
                ),
                format!(
                    "{node}: device plugin {names} {already}runs without the container toolkit"
                ),
            ),
        };
        out.push(Found {
            rule: Rule::ForeignDevicePlugin,
            change,
            message,
            warning,
        });
    }

    /// The foreign plugins cannot be read: a request that takes the container toolkit off a
    /// GPU node is judged as if one ran there, and the message says why it cannot tell.
    fn foreign_plugins_unknown(&self, why: &str, out: &mut Vec<Found>) {
        let toolkit_lost = self.review.old_labels.is_some()
            && self.toolkit_provided(self.before.set)
            && !self.toolkit_provided(self.after.set);
        if self.assessing || !toolkit_lost || !is_gpu_node(self.review.labels) {
            return;
        }
        let node = self.node();
        out.push(Found {
            rule: Rule::ForeignDevicePlugin,
            change: Change::New,
            message: format!(
                "node {node}: this request leaves no container toolkit on the node, and whether a \
                 device-plugin DaemonSet outside the GPU Operator runs there cannot be told \
                 ({why}); such a plugin would advertise GPUs that pods cannot open. Retry once \
                 the guard reads the DaemonSets."
            ),
            warning: format!(
                "{node}: cannot tell whether a device plugin outside the operator runs here ({why})"
            ),
        });
    }
}
