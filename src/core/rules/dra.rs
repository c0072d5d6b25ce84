//! The rule on NVIDIA's DRA driver beside the device plugin ([`crate::core::dra`]): a state
//! rule, judged on the node's labels and the nodes the driver publishes ResourceSlices for.

use super::{Ctx, Found, Rule};
use crate::core::dra::DraNodes;
use crate::core::operands::{Operand, OperandSet};

impl Ctx<'_, '_> {
    /// `device-plugin-beside-dra-driver`: the device plugin runs on a node NVIDIA's DRA driver
    /// publishes GPU ResourceSlices for ([`crate::core::dra`]): the same GPUs advertised twice.
    /// When the slices cannot be read, a request that starts the device plugin is judged as
    /// if they were there, and the message says why it cannot tell.
    pub(super) fn device_plugin_beside_dra_driver(&self, out: &mut Vec<Found>) {
        let runs = |set: OperandSet| set.contains(Operand::DevicePlugin);
        if !runs(self.after.set) {
            return;
        }
        let node = self.node();
        let had = self.review.old_labels.is_some() && runs(self.before.set);
        let driver = crate::core::dra::NVIDIA_GPU_DRIVER;
        let (message, warning) = match &self.facts.dra_nodes {
            DraNodes::NotRead => return,
            DraNodes::Known(nodes) => {
                if !nodes.contains(self.review.node) {
                    return;
                }
                let already = if had { "already " } else { "" };
                (
                    format!(
                        "node {node}: the NVIDIA device plugin {already}runs beside NVIDIA's DRA \
                         driver, which publishes ResourceSlices of driver {driver} for this node: \
                         both advertise the same GPUs, and the scheduler can give one GPU to a \
                         pod of each. Set {}=false on nodes the DRA driver serves (with the \
                         DRAExtendedResource feature it serves nvidia.com/gpu requests itself), \
                         or remove the DRA driver from this node.",
                        Operand::DevicePlugin.key()
                    ),
                    format!("{node}: device-plugin {already}runs beside the {driver} DRA driver"),
                )
            }
            DraNodes::Unknown(why) => {
                if had || self.assessing {
                    return;
                }
                (
                    format!(
                        "node {node}: this request starts the NVIDIA device plugin, and whether \
                         NVIDIA's DRA driver publishes ResourceSlices of driver {driver} for this \
                         node cannot be told ({why}); with both, the scheduler can give one GPU \
                         to two pods. Retry once the guard reads the ResourceSlices."
                    ),
                    format!(
                        "{node}: cannot tell whether a {driver} DRA driver serves this node ({why})"
                    ),
                )
            }
        };
        out.push(Found {
            rule: Rule::DevicePluginBesideDraDriver,
            change: self.change(had),
            message,
            warning,
        });
    }
}
