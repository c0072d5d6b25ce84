//! The fleet rules: each judges one GPU-policy change over the groups of nodes it reaches and
//! names the nodes. Each is the function of its row of [`RULES`](super::RULES)
//! (`Check::Fleet`); [`FleetCtx::run`] runs them in the table's order.

mod drivers;
mod rollout;
mod stacks;
mod switches;

pub(crate) use stacks::stacks_conflict;

use super::{Change, Check, Found, RULES, Rule};
use crate::core::echo::echo;
use crate::core::facts::ClusterFacts;
use crate::core::policy_change::model::{Outcome, PolicyChange, PolicyReview};
use crate::core::review::Operation;
use drivers::{
    beside_policy_driver, driver_lost, not_reconciled, overlap, overlap_unknown,
    unkept_selector_keys,
};
use switches::{
    device_plugin_stops, driver_back_where_served, runtime_classes_deleted, sandbox_swaps,
    toolkit_blind, toolkit_on_nodes,
};

/// Nodes named in one message at most; the rest are counted.
pub const NAMED_NODES: usize = 5;

/// Everything a fleet rule reads.
pub struct FleetCtx<'r> {
    /// The request as it was made: what the rules on the request itself read (a second
    /// ClusterPolicy, a ClusterPolicy beside a GPUCluster).
    pub(crate) request: &'r PolicyReview<'r>,
    /// What the GPU Operator carries out of it, which the rules on the fleet judge: the request,
    /// or the request as if no GPUCluster existed (both exist: it takes effect once the
    /// GPUCluster goes); `None` when the operator acts on nothing of it (an ignored ClusterPolicy,
    /// a new ClusterPolicy-GPUCluster conflict, a GPUCluster alone).
    pub(crate) effect: Option<&'r PolicyReview<'r>>,
    /// `ClusterPolicy <name>`, `NVIDIADriver <name>`, as messages name it.
    pub(crate) object: String,
    /// The same, for a ClusterPolicy's DELETE naming the ClusterPolicy the operator follows next.
    pub(crate) policy_object: String,
    /// What runs on each group of nodes before and after the effect, or why the nodes are not
    /// known.
    pub(crate) outcomes: Result<&'r [Outcome<'r, 'r>], &'r str>,
    /// Whether the groups' labels hold a key (the records keep what decisions read).
    pub(crate) keeps: &'r dyn Fn(&str) -> bool,
}

impl<'r> FleetCtx<'r> {
    pub(crate) fn new(
        request: &'r PolicyReview<'r>,
        effect: Option<&'r PolicyReview<'r>>,
        outcomes: Result<&'r [Outcome<'r, 'r>], &'r str>,
        keeps: &'r dyn Fn(&str) -> bool,
    ) -> Self {
        let object = format!("{} {}", request.kind.as_str(), echo(request.name));
        // A DELETE is judged as the hand-over to the ClusterPolicy followed next (of a
        // ClusterPolicy: the next one; of a GPUCluster beside a ClusterPolicy: that one).
        let policy_object = match (request.operation, request.change) {
            (Operation::Delete, PolicyChange::ClusterPolicy { others, .. })
                if !others.is_empty() =>
            {
                format!(
                    "{object} (deleted: the GPU Operator then follows ClusterPolicy {})",
                    echo(&others[0])
                )
            }
            _ => object.clone(),
        };
        FleetCtx {
            request,
            effect,
            object,
            policy_object,
            outcomes,
            keeps,
        }
    }

    /// Runs every fleet rule, in table order.
    pub(crate) fn run(&self, out: &mut Vec<Found>) {
        for spec in &RULES {
            for check in spec.checks {
                if let Check::Fleet(check) = check {
                    check(self, out);
                }
            }
        }
    }

    /// What runs where before and after the change the operator carries out, when it carries
    /// one out and the nodes are known.
    pub(crate) fn known(&self) -> Option<&'r [Outcome<'r, 'r>]> {
        self.effect?;
        self.outcomes.ok()
    }

    /// The facts before and after a ClusterPolicy change the operator carries out.
    fn cluster_policy(&self) -> Option<(&'r ClusterFacts, &'r ClusterFacts)> {
        match self.effect?.change {
            PolicyChange::ClusterPolicy { before, after, .. } => Some((before, after)),
            _ => None,
        }
    }
}

/// "a, b, c, d, e and 7 more"
pub fn name_nodes<'a>(nodes: impl IntoIterator<Item = &'a str>) -> (usize, String) {
    let mut all: Vec<&str> = nodes.into_iter().collect();
    all.sort_unstable();
    let shown: Vec<String> = all
        .iter()
        .take(NAMED_NODES)
        .map(|n| echo(n).into_owned())
        .collect();
    let text = match all.len().saturating_sub(NAMED_NODES) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    };
    (all.len(), text)
}

/// "node" for one, "nodes" for several.
pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 { "node" } else { "nodes" }
}

/// "loses" for one node, "lose" for several.
fn lose(n: usize) -> &'static str {
    if n == 1 { "loses" } else { "lose" }
}

/// A new finding of a fleet rule.
pub(crate) fn finding(rule: Rule, message: String, warning: String) -> Found {
    Found {
        rule,
        change: Change::New,
        message,
        warning,
    }
}

/// `toolkit-switched-off`: the toolkit stops where the device plugin keeps running; without
/// the nodes, wherever the device plugin stays enabled.
pub(super) fn toolkit_switched_off(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    let Some((before, after)) = ctx.cluster_policy() else {
        return;
    };
    match ctx.outcomes {
        Ok(outcomes) => toolkit_on_nodes(&ctx.policy_object, before, after, outcomes, out),
        Err(why) => toolkit_blind(&ctx.object, before, after, why, out),
    }
}

/// `toolkit-rollout-not-recreated`: a change of the toolkit's pod template on nodes where the
/// new pod would not be created while the device plugin stays.
pub(super) fn toolkit_rollout_not_recreated(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let (Some((before, after)), Some(outcomes)) = (ctx.cluster_policy(), ctx.known())
        && ctx.request.operation == Operation::Update
    {
        rollout::toolkit_not_recreated(&ctx.policy_object, before, after, outcomes, out);
    }
}

/// `device-plugin-switched-off`.
pub(super) fn device_plugin_switched_off(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let (Some((before, after)), Some(outcomes)) = (ctx.cluster_policy(), ctx.known()) {
        device_plugin_stops(&ctx.policy_object, before, after, outcomes, out);
    }
}

/// `sandbox-relabel`.
pub(super) fn sandbox_relabel(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let (Some((before, after)), Some(outcomes)) = (ctx.cluster_policy(), ctx.known())
        && before.sandbox != after.sandbox
    {
        sandbox_swaps(&ctx.policy_object, before, after, outcomes, out);
    }
}

/// `driver-selected-twice`: the ClusterPolicy's driver back where NVIDIADrivers serve, or an
/// NVIDIADriver deployed where the ClusterPolicy's driver runs.
pub(super) fn driver_selected_twice(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    let (Some(effect), Some(outcomes)) = (ctx.effect, ctx.known()) else {
        return;
    };
    match effect.change {
        PolicyChange::ClusterPolicy {
            before,
            after,
            drivers,
            ..
        } => driver_back_where_served(&ctx.policy_object, before, after, drivers, outcomes, out),
        PolicyChange::NvidiaDriver {
            facts,
            before,
            after: Some(this),
            ..
        } => beside_policy_driver(&ctx.object, facts, before, this, outcomes, out),
        _ => {}
    }
}

/// `nvidia-driver-not-reconciled`.
pub(super) fn nvidia_driver_not_reconciled(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let Some(PolicyChange::NvidiaDriver {
        facts,
        after: Some(this),
        ..
    }) = ctx.effect.map(|e| e.change)
    {
        not_reconciled(&ctx.object, facts, this, ctx.known(), out);
    }
}

/// `runtime-classes-removed`.
pub(super) fn runtime_classes_removed(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let (Some((before, after)), Some(outcomes)) = (ctx.cluster_policy(), ctx.known()) {
        runtime_classes_deleted(&ctx.policy_object, before, after, outcomes, out);
    }
}

/// `driver-removed`.
pub(super) fn driver_removed(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if let (Some(effect), Some(outcomes)) = (ctx.effect, ctx.known()) {
        driver_lost(effect, &ctx.object, outcomes, out);
    }
}

/// `nvidia-driver-overlap`: the NVIDIADriver selects a node another one selects, or that
/// cannot be told (the others not known, a selector on a label the records lack).
pub(super) fn nvidia_driver_overlap(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    let (Some(effect), Some(outcomes)) = (ctx.effect, ctx.known()) else {
        return;
    };
    if let PolicyChange::NvidiaDriver {
        after: Some(this),
        others,
        facts,
        ..
    } = effect.change
    {
        if facts.nvidia_drivers.is_none() {
            overlap_unknown(&ctx.object, out);
        } else {
            overlap(&ctx.object, facts, this, others, outcomes, out);
        }
    }
    unkept_selector_keys(effect, ctx.keeps, out);
}

/// `cluster-policy-ignored`: a second ClusterPolicy.
pub(super) fn cluster_policy_ignored(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    if ctx.request.operation == Operation::Create
        && let PolicyChange::ClusterPolicy { others, .. } = ctx.request.change
        && let Some(first) = others.first()
    {
        let msg = format!(
            "{}: ClusterPolicy {} already exists; the GPU Operator follows one ClusterPolicy and marks the others ignored.",
            ctx.policy_object,
            echo(first)
        );
        out.push(finding(Rule::ClusterPolicyIgnored, msg.clone(), msg));
    }
}

/// `gpu-cluster-conflict`.
pub(super) fn gpu_cluster_conflict(ctx: &FleetCtx<'_>, out: &mut Vec<Found>) {
    out.extend(stacks_conflict(ctx.request));
}
