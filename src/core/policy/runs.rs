//! What a node runs once the DaemonSet controller has acted on its labels and its taints
//! ([`crate::core::placement`]): the operands its labels select, less those a taint keeps off.

use super::simulate;
use crate::core::facts::ClusterFacts;
use crate::core::operands::{Labels, OperandSet};
use crate::core::placement::{NodePlacement, Placement, Runs};

/// What the node named `name` runs with these labels and taints. `running`: the operands whose
/// pod runs there now; an operand a `NoSchedule` taint only keeps runs on if it ran. `None`
/// (not known: the node before a request) takes every kept one to run, as it did when the
/// taint came. Judging a request, pass the taints that last ([`NodePlacement::lasting`]); the
/// audit passes them all.
pub fn runs(
    name: &str,
    labels: &Labels,
    node: &NodePlacement,
    running: Option<OperandSet>,
    facts: &ClusterFacts,
) -> Runs {
    let selected = simulate(labels, facts);
    let mut out = Runs::default();
    for op in selected.iter() {
        let placement = facts.place(op, name, labels, node);
        match &placement {
            Placement::Placed => out.set.insert(op),
            Placement::Kept(_) => {
                if running.is_none_or(|r| r.contains(op)) {
                    out.set.insert(op);
                    out.not_recreated.insert(op);
                }
            }
            Placement::Evicted(_) | Placement::NotSelected => {}
        }
        if placement.taint().is_some() || placement == Placement::NotSelected {
            out.blocked.insert(op, placement);
        }
    }
    out
}

#[cfg(test)]
mod tests;
