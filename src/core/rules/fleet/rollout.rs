//! The fleet rule on a rollout: a ClusterPolicy change that changes the container toolkit's
//! pod template makes the DaemonSet controller delete the toolkit's pod on every node and
//! create the new one only where it should run; under an untolerated `NoSchedule` taint it
//! never does (`docs/gpu-operator.md` §13).

use std::collections::BTreeSet;

use super::{finding, name_nodes, plural};
use crate::core::echo::echo;
use crate::core::facts::ClusterFacts;
use crate::core::operands::Operand;
use crate::core::placement::Placement;
use crate::core::policy_change::model::{HOST_TOOLKIT_ANNOTATION, Outcome};
use crate::core::rules::{Found, Rule};

/// Taints named in one message at most.
const NAMED_TAINTS: usize = 3;

pub(super) fn toolkit_not_recreated(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    let rollout = before.templates.rollout(&after.templates);
    let rolls = |op: Operand| rollout.operands.contains(op);
    if !rolls(Operand::ContainerToolkit) {
        return;
    }
    let mut nodes = Vec::new();
    let mut taints = BTreeSet::new();
    for o in outcomes {
        let node = o.group.placement.lasting();
        let Some(sample) = o.group.nodes.first().copied() else {
            continue;
        };
        if !node.is_tainted()
            || !o.before.contains(Operand::ContainerToolkit)
            || !o.after.contains(Operand::ContainerToolkit)
            || !o.after.contains(Operand::DevicePlugin)
        {
            continue;
        }
        let runs_before = |op: Operand| {
            o.before.contains(op)
                && matches!(
                    before.place(op, sample, &o.before_labels, &node),
                    Placement::Placed | Placement::Kept(_)
                )
        };
        let place_after = |op: Operand| after.place(op, sample, &o.after_labels, &node);
        // The new toolkit pod is not created, the old one is deleted by the rollout (a
        // NoExecute taint evicts it anyway, which the state rules judge).
        let Placement::Kept(taint) = place_after(Operand::ContainerToolkit) else {
            continue;
        };
        if !runs_before(Operand::ContainerToolkit) {
            continue;
        }
        let device_plugin_stays = match place_after(Operand::DevicePlugin) {
            Placement::Placed => true,
            Placement::Kept(_) => {
                !rolls(Operand::DevicePlugin) && runs_before(Operand::DevicePlugin)
            }
            Placement::Evicted(_) | Placement::NotSelected => false,
        };
        if device_plugin_stays {
            nodes.extend(o.group.nodes.iter().copied());
            taints.insert(taint.to_string());
        }
    }
    let (count, names) = name_nodes(nodes);
    if count == 0 {
        return;
    }
    let shown: Vec<String> = taints
        .iter()
        .take(NAMED_TAINTS)
        .map(|t| echo(t).into_owned())
        .collect();
    let more = taints.len().saturating_sub(NAMED_TAINTS);
    let taint_text = if more == 0 {
        shown.join(", ")
    } else {
        format!("{} and {more} more", shown.join(", "))
    };
    out.push(finding(
        Rule::ToolkitRolloutNotRecreated,
        format!(
            "{object}: this change rolls the container toolkit DaemonSet ({}); on {count} {} ({names}) \
             a NoSchedule taint the toolkit does not tolerate ({taint_text}) keeps the new pod off, \
             so the old one exits, removing the nvidia runtime, while the device plugin keeps advertising GPUs \
             and GPU pods scheduled there cannot start. Remove or tolerate the taint (spec.daemonsets.tolerations) \
             before the change, or drain those nodes; if the hosts bring their own toolkit, set {HOST_TOOLKIT_ANNOTATION}.",
            rollout
                .changed
                .iter()
                .map(|c| echo(c).into_owned())
                .collect::<Vec<_>>()
                .join("; "),
            plural(count)
        ),
        format!(
            "{object}: the toolkit's rollout leaves {count} tainted {} ({names}) without it while the device plugin runs",
            plural(count)
        ),
    ));
}
