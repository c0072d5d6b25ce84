//! The state rules on where the DaemonSet controller places the operands' pods: operands that
//! run under a taint their DaemonSet does not tolerate keep their pod, but never get it back
//! ([`crate::core::placement`]).

use super::{Change, Ctx, Found, Rule};
use crate::core::operands::{Operand, OperandSet};
use crate::core::placement::{Placement, Runs, Taint};

impl Ctx<'_, '_> {
    /// Why a selected operand does not run (or would not be re-created) after the request, when
    /// a taint or the required node affinity stops the DaemonSet controller; else the state of
    /// its deploy label.
    pub(super) fn operand_state(&self, op: Operand) -> String {
        let why = match self.after.blocked.get(&op) {
            Some(Placement::Evicted(t)) => {
                format!(
                    "its DaemonSet does not tolerate the node's taint {t}, which evicts its pod"
                )
            }
            Some(Placement::Kept(t)) if !self.after.set.contains(op) => {
                format!(
                    "its DaemonSet does not tolerate the node's taint {t}, so no pod of it is created"
                )
            }
            Some(Placement::NotSelected) => {
                "its DaemonSet's required node affinity does not pick the node".to_owned()
            }
            _ => return self.label_state(op.key()),
        };
        format!("{} is \"true\", but {why}", op.key())
    }

    /// The untolerated taints that keep `ops` running without re-creating them, in words.
    fn keeping_taints(&self, ops: OperandSet) -> String {
        let mut taints: Vec<&Taint> = ops
            .iter()
            .filter_map(|op| self.after.blocked.get(&op).and_then(Placement::taint))
            .collect();
        taints.sort();
        taints.dedup();
        let words: Vec<String> = taints.iter().map(|t| t.to_string()).collect();
        words.join(", ")
    }

    fn toolkit_kept_beside_plugin(&self, runs: &Runs) -> bool {
        self.facts.toolkit_managed
            && runs.set.contains(Operand::DevicePlugin)
            && runs.not_recreated.contains(Operand::ContainerToolkit)
    }

    pub(super) fn toolkit_not_recreated(&self, out: &mut Vec<Found>) {
        if !self.toolkit_kept_beside_plugin(self.after) {
            return;
        }
        let node = self.node();
        let taints = self.keeping_taints(OperandSet::of(&[Operand::ContainerToolkit]));
        let change = self.change(self.toolkit_kept_beside_plugin(self.before));
        let already = if change == Change::Existing {
            " already"
        } else {
            ""
        };
        out.push(Found {
            rule: Rule::ToolkitNotRecreated,
            change,
            message: format!(
                "node {node}{already} runs the container toolkit under the taint {taints}, which its \
                 DaemonSet does not tolerate: the DaemonSet controller keeps the pod that runs but never \
                 creates it again, so the next rollout of the toolkit (a change of the ClusterPolicy's \
                 spec.toolkit or spec.daemonsets, an operator upgrade) or a deletion of its pod removes \
                 it for good, its exit unconfigures the container runtime, and the device plugin keeps \
                 advertising GPUs that pods cannot use; remove the taint, or add a toleration for it to \
                 the ClusterPolicy's spec.daemonsets.tolerations{}.",
                self.unchanged_if(change)
            ),
            warning: format!(
                "{node}: container-toolkit would never be re-created under taint {taints} while device-plugin runs"
            ),
        });
    }

    pub(super) fn operands_not_recreated(&self, out: &mut Vec<Found>) {
        let kept = |runs: &Runs| -> OperandSet {
            let mut set = runs.not_recreated;
            if self.toolkit_kept_beside_plugin(runs) {
                // Said by toolkit-not-recreated, with what it breaks.
                set.remove(Operand::ContainerToolkit);
            }
            set
        };
        let (after, before) = (kept(self.after), kept(self.before));
        if after.is_empty() {
            return;
        }
        let taints = self.keeping_taints(after);
        self.per_subset(out, Rule::OperandsNotRecreated, after, before, |names, change| {
            let node = self.node();
            let head = match change {
                Change::New => format!("node {node}: {names} would run"),
                Change::Existing => format!("node {node} already runs {names}"),
            };
            (
                format!(
                    "{head} under the taint {taints}, which their DaemonSets do not tolerate: the DaemonSet \
                     controller keeps the pods that run but never creates them again, so a rollout or a \
                     deletion of a pod removes that operand from the node for good; remove the taint, or \
                     add a toleration for it to the ClusterPolicy's spec.daemonsets.tolerations{}.",
                    self.unchanged_if(change)
                ),
                format!("{node}: {names} would never be re-created under taint {taints}"),
            )
        });
    }

    fn unchanged_if(&self, change: Change) -> &'static str {
        if change == Change::Existing {
            self.unchanged()
        } else {
            ""
        }
    }
}
