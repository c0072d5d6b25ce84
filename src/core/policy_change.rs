//! Changes of the cluster's GPU policy (a ClusterPolicy, an NVIDIADriver) decided over every
//! node the change reaches, the way [`decide`](super::policy::decide) decides a label change
//! for one node.
//!
//! Pure. The caller gives the facts before and after the change (the switches of the old and
//! the new object, the rest from the cluster), the NVIDIADriver resources, and the fleet as
//! groups of nodes with identical decision-relevant labels; a fleet has few distinct label
//! sets, so the work is per group, not per node. For each group the operator's labelling pass
//! is applied under the old and the new facts (so that only what the request changes counts),
//! the DaemonSet controller is simulated on the result, and the transitions are judged:
//!
//! - `toolkit-switched-off` (deny): the container toolkit stops being deployed where the device
//!   plugin keeps running. Its exit removes the `nvidia` runtime while the device plugins go on
//!   advertising GPUs (`docs/gpu-operator.md` §11). A person whose hosts really bring their own
//!   toolkit says so in the same request with [`HOST_TOOLKIT_ANNOTATION`].
//! - `toolkit-rollout-not-recreated` (deny): the change rolls the toolkit's DaemonSet (its
//!   pod template changes) on nodes where an untolerated `NoSchedule` taint keeps the new pod
//!   off while the device plugin stays: the old pod exits and nothing replaces it. The same
//!   annotation lets it through.
//! - `driver-removed` (warn): nodes lose their driver DaemonSet (`driver.enabled` off, the hand
//!   over to NVIDIADriver resources, an NVIDIADriver deleted or no longer selecting them).
//! - `sandbox-relabel` (warn): `sandboxWorkloads` swaps the operands of nodes.
//! - `nvidia-driver-overlap` (deny): an NVIDIADriver would select a node another one selects.
//! - every state rule of the label decision, transition-aware: a finding the change creates on
//!   some node is acted on with the rule's action, naming the nodes.

use std::collections::{BTreeMap, BTreeSet};

use super::facts::{ClusterFacts, DriversReconciled};
use super::nvidia_driver::{NvidiaDriver, PoolKey};
use super::operands::{Labels, Operand, OperandSet, selector_matches};
use super::operator::labelling_pass;
use super::policy::{self, Policy, PolicyNote, Verdict};
use super::review::Operation;
use super::rules::fleet::{finding, name_nodes, plural, stacks_conflict};
use super::rules::{Action, Change, FleetCtx, Found, Rule};

pub mod model;
pub use model::{
    Fleet, HOST_TOOLKIT_ANNOTATION, NodeGroup, Outcome, PolicyChange, PolicyKind, PolicyReview,
};

/// Decides one GPU-policy change over the fleet.
pub fn decide_policy(review: &PolicyReview<'_>, fleet: Fleet<'_>, policy: &Policy) -> Verdict {
    let facts = match review.change {
        PolicyChange::ClusterPolicy { after, .. } => after,
        PolicyChange::NvidiaDriver { facts, .. } | PolicyChange::GpuCluster { facts, .. } => facts,
    };
    let mut findings = Vec::new();
    match effect(review) {
        Effect::Request => judge_fleet(review, Some(review), fleet, policy, &mut findings),
        Effect::Alone(facts) => {
            let (before, after) = &*facts;
            let PolicyChange::ClusterPolicy {
                host_toolkit,
                others,
                drivers,
                ..
            } = review.change
            else {
                unreachable!("only a ClusterPolicy change is judged alone")
            };
            let alone = PolicyReview {
                change: PolicyChange::ClusterPolicy {
                    before,
                    after,
                    host_toolkit,
                    others,
                    drivers,
                },
                ..*review
            };
            judge_fleet(review, Some(&alone), fleet, policy, &mut findings);
        }
        Effect::Nothing => judge_fleet(review, None, fleet, policy, &mut findings),
    }
    // A policy object a person creates changes what runs at once: judged like an UPDATE (a
    // Node's CREATE is the kubelet registering it, and is lowered).
    let mut findings = policy::act(findings, policy, Operation::Update);
    let override_note = match review.change {
        PolicyChange::ClusterPolicy {
            host_toolkit: Some(why),
            ..
        } => {
            // The person said the hosts bring the toolkit: the refusal becomes a record.
            let mut said = None;
            for f in &mut findings {
                if matches!(
                    f.rule,
                    Rule::ToolkitSwitchedOff | Rule::ToolkitRolloutNotRecreated
                ) && f.action == Action::Deny
                {
                    f.action = Action::Audit;
                    said = Some(format!(
                        "{HOST_TOOLKIT_ANNOTATION}={}",
                        super::echo::echo(why)
                    ));
                }
            }
            said
        }
        _ => None,
    };
    let mut verdict = policy::conclude(
        findings,
        policy::exemption(review.username, review.groups, &policy.exemptions),
        policy,
        OperandSet::EMPTY,
        OperandSet::EMPTY,
        facts.annotation(),
    );
    verdict.policy_change = Some(PolicyNote {
        object: format!("{}/{}", review.kind.as_str(), review.name),
        nodes: match fleet {
            Fleet::Known { groups, .. } => Some(groups.iter().map(|g| g.nodes.len()).sum()),
            Fleet::Unknown(_) => None,
        },
        host_toolkit: override_note,
    });
    verdict
}

/// What the GPU Operator carries out of a request.
enum Effect {
    /// The request as it is.
    Request,
    /// A ClusterPolicy change while a GPUCluster exists: nothing is reconciled while both exist,
    /// and the change takes effect as soon as the GPUCluster goes, so it is judged as that (it
    /// cannot wait there to switch the toolkit off).
    Alone(Box<(ClusterFacts, ClusterFacts)>),
    /// Nothing: a second ClusterPolicy (ignored), a change that makes a ClusterPolicy and a
    /// GPUCluster exist at once (neither is reconciled), a GPUCluster alone (not judged over the
    /// fleet; its DELETE that hands the operator to a ClusterPolicy is, as that ClusterPolicy's
    /// change).
    Nothing,
}

fn effect(review: &PolicyReview<'_>) -> Effect {
    match (stacks_conflict(review), review.change) {
        (Some(c), PolicyChange::ClusterPolicy { before, after, .. })
            if c.change == Change::Existing =>
        {
            Effect::Alone(Box::new((
                before.clone().without_gpu_cluster(),
                after.clone().without_gpu_cluster(),
            )))
        }
        (Some(_), _) => Effect::Nothing,
        (None, PolicyChange::ClusterPolicy { others, .. })
            if review.operation == Operation::Create && !others.is_empty() =>
        {
            Effect::Nothing
        }
        (
            None,
            PolicyChange::ClusterPolicy { .. }
            | PolicyChange::NvidiaDriver { .. }
            | PolicyChange::GpuCluster { .. },
        ) => Effect::Request,
    }
}

/// Runs every fleet rule over what `effect` (what the operator carries out of `request`) does
/// on the fleet, then every state rule on each group of nodes before and after it.
fn judge_fleet(
    request: &PolicyReview<'_>,
    effect: Option<&PolicyReview<'_>>,
    fleet: Fleet<'_>,
    policy: &Policy,
    findings: &mut Vec<Found>,
) {
    let outcomes: Result<Vec<Outcome<'_, '_>>, &str> = match (effect, fleet) {
        (Some(effect), Fleet::Known { groups, .. }) => {
            let pools = rendered_pools(effect, groups);
            Ok(groups
                .iter()
                .map(|g| outcome(effect, g, pools.as_ref()))
                .collect())
        }
        (None, Fleet::Known { .. }) => Ok(Vec::new()),
        (_, Fleet::Unknown(why)) => Err(why),
    };
    let keeps = match fleet {
        Fleet::Known { keeps, .. } => keeps,
        Fleet::Unknown(_) => &|_: &str| true,
    };
    let ctx = FleetCtx::new(
        request,
        effect,
        outcomes.as_deref().map_err(|why| *why),
        keeps,
    );
    ctx.run(findings);
    if let (Some(effect), Some(outcomes)) = (effect, ctx.known()) {
        state_transitions(effect, &ctx.object, outcomes, policy, findings);
    }
}

/// Where one operand runs before and after a change: the prediction `check-policy` and the
/// kubectl plugin print, and what the e2e oracle compares with the operator's DaemonSets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shift {
    pub operand: Operand,
    /// Nodes it runs on now, and once the change is applied.
    pub before: usize,
    pub after: usize,
    /// Nodes it starts on, and stops on; sorted.
    pub starts: Vec<String>,
    pub stops: Vec<String>,
}

/// What the change does to every operand that runs somewhere before or after it, in the order
/// of [`Operand::all`]: the same simulation [`decide_policy`] judges (for the driver, any driver
/// DaemonSet: the ClusterPolicy's or an NVIDIADriver's).
pub fn shifts(review: &PolicyReview<'_>, groups: &[NodeGroup<'_>]) -> Vec<Shift> {
    let pools = rendered_pools(review, groups);
    let outcomes: Vec<Outcome<'_, '_>> = groups
        .iter()
        .map(|g| outcome(review, g, pools.as_ref()))
        .collect();
    let runs = |o: &Outcome<'_, '_>, op: Operand, after: bool| match (op, after) {
        (Operand::Driver, false) => o.driver_before,
        (Operand::Driver, true) => o.driver_after,
        (_, false) => o.before.contains(op),
        (_, true) => o.after.contains(op),
    };
    let mut out = Vec::new();
    for op in Operand::all() {
        let mut shift = Shift {
            operand: op,
            before: 0,
            after: 0,
            starts: Vec::new(),
            stops: Vec::new(),
        };
        for o in &outcomes {
            let (b, a) = (runs(o, op, false), runs(o, op, true));
            let n = o.group.nodes.len();
            shift.before += if b { n } else { 0 };
            shift.after += if a { n } else { 0 };
            match (b, a) {
                (false, true) => shift
                    .starts
                    .extend(o.group.nodes.iter().map(|n| (*n).to_owned())),
                (true, false) => shift
                    .stops
                    .extend(o.group.nodes.iter().map(|n| (*n).to_owned())),
                _ => {}
            }
        }
        if shift.before + shift.after > 0 {
            shift.starts.sort_unstable();
            shift.stops.sort_unstable();
            out.push(shift);
        }
    }
    out
}

/// Whether a driver DaemonSet runs on a node with these labels running `ops` under `facts`:
/// the ClusterPolicy's, or with `driver.useNvidiaDriverCRD` an NVIDIADriver's.
fn driver_runs(
    facts: &ClusterFacts,
    drivers: &[NvidiaDriver],
    ops: OperandSet,
    labels: &Labels,
) -> bool {
    if facts.driver_crd {
        drivers
            .iter()
            .any(|d| d.selects(labels, &facts.operator.version))
    } else {
        ops.contains(Operand::Driver)
    }
}

/// The OS pools the new selector of a changed NVIDIADriver renders over the fleet: a pool still
/// rendered keeps its DaemonSet, updated in place with the new selector.
fn rendered_pools(
    review: &PolicyReview<'_>,
    groups: &[NodeGroup<'_>],
) -> Option<BTreeSet<PoolKey>> {
    match review.change {
        PolicyChange::NvidiaDriver { after: Some(d), .. } => {
            Some(groups.iter().filter_map(|g| d.renders(&g.labels)).collect())
        }
        _ => None,
    }
}

fn outcome<'g, 'a>(
    review: &PolicyReview<'_>,
    group: &'g NodeGroup<'a>,
    pools: Option<&BTreeSet<PoolKey>>,
) -> Outcome<'g, 'a> {
    let labels = &group.labels;
    match review.change {
        PolicyChange::ClusterPolicy {
            before,
            after,
            drivers,
            ..
        } => {
            let (relabel_before, relabel_after, after_labels) = if before.sandbox == after.sandbox {
                let now = policy::simulate(labels, after);
                (now, now, labels.clone())
            } else {
                let old =
                    labelling_pass(labels, before.operator.era(), &before.sandbox, before.stack)
                        .labels;
                let new = labelling_pass(labels, after.operator.era(), &after.sandbox, after.stack)
                    .labels;
                (
                    policy::simulate(&old, before),
                    policy::simulate(&new, after),
                    new,
                )
            };
            let b = policy::simulate(labels, before);
            let a = policy::simulate(&after_labels, after);
            // From v26.7 the hand-over to NVIDIADriver resources leaves the ClusterPolicy's
            // driver pods running, orphaned, until the NVIDIADriver upgrade replaces them.
            let orphaned = |labels: &Labels| {
                before.operator.era().orphans_policy_driver_on_handover()
                    && !before.driver_crd
                    && policy::simulate(labels, before).contains(Operand::Driver)
            };
            let driver = |facts: &ClusterFacts, ops: OperandSet, labels: &Labels| {
                driver_runs(facts, drivers, ops, labels) || (facts.driver_crd && orphaned(labels))
            };
            Outcome {
                group,
                driver_before: driver(before, b, labels),
                driver_after: driver(after, a, &after_labels),
                before_labels: labels.clone(),
                after_labels,
                before: b,
                after: a,
                relabel_before,
                relabel_after,
            }
        }
        PolicyChange::GpuCluster { facts, after, .. } => {
            // The stack the GPUCluster brings relabels the nodes on the operator's next pass;
            // its drivers are NVIDIADriver resources'.
            let after_labels =
                labelling_pass(labels, after.operator.era(), &after.sandbox, after.stack).labels;
            let b = policy::simulate(labels, facts);
            let a = policy::simulate(&after_labels, after);
            let drivers = after.nvidia_drivers.as_deref().unwrap_or_default();
            Outcome {
                group,
                driver_before: driver_runs(facts, drivers, b, labels),
                driver_after: driver_runs(after, drivers, a, &after_labels),
                before_labels: labels.clone(),
                after_labels,
                before: b,
                after: a,
                relabel_before: b,
                relabel_after: a,
            }
        }
        PolicyChange::NvidiaDriver {
            facts,
            before,
            after,
            others,
        } => nvidia_driver_outcome(group, facts, (before, after), others, pools),
    }
}

/// What an NVIDIADriver change does on one group: only where a driver DaemonSet runs differs.
/// `pools`: the OS pools its new selector renders over the fleet ([`rendered_pools`]).
fn nvidia_driver_outcome<'g, 'a>(
    group: &'g NodeGroup<'a>,
    facts: &ClusterFacts,
    (before, after): (Option<&NvidiaDriver>, Option<&NvidiaDriver>),
    others: &[NvidiaDriver],
    pools: Option<&BTreeSet<PoolKey>>,
) -> Outcome<'g, 'a> {
    let labels = &group.labels;
    let ops = policy::simulate(labels, facts);
    let version = &facts.operator.version;
    let era = facts.operator.era();
    // While `useNvidiaDriverCRD` is off the ClusterPolicy's own driver DaemonSet runs,
    // beside the NVIDIADriver ones before v26.3 (`docs/gpu-operator.md` §11.3).
    let by_policy = facts.policy_driver_runs() && ops.contains(Operand::Driver);
    let by_others = by_policy || others.iter().any(|d| serves_now(facts, d, labels));
    let before_here = before.is_some_and(|d| serves_now(facts, d, labels));
    let driver_before = by_others || before_here;
    let no_pool = pools.is_some_and(BTreeSet::is_empty);
    // A deleted resource's DaemonSets always go (garbage collection). Not carried out: the flag
    // off from v26.3, no ClusterPolicy before v26.7, and before v26.3 a selector that matches no
    // pooled node ("no nodes matching the given node selector": nothing is applied).
    let carried_out = after.is_none()
        || (facts.nvidia_drivers_reconciled() == DriversReconciled::Yes
            && !(no_pool && era.keeps_dropped_driver_pools()));
    if !carried_out {
        return Outcome::labels_kept(group, ops, driver_before, driver_before);
    }
    // Each pool the new selector still renders keeps its DaemonSet, updated in place with the
    // new selector; a pool it no longer renders keeps its DaemonSet, with the selector it has,
    // before v26.3, and loses it from v26.3 (`docs/gpu-operator.md` §11.4).
    let rendered =
        |pool: Option<PoolKey>| pool.is_some_and(|p| pools.is_some_and(|set| set.contains(&p)));
    let kept = match (before, after) {
        (Some(b), Some(_)) if era.keeps_dropped_driver_pools() => {
            let live = live_selectors(facts, b).unwrap_or_default();
            live.iter()
                .any(|sel| !rendered(b.pool_key(sel)) && selector_matches(sel, labels))
                || (b.selects(labels, version) && !rendered(b.pool_key(labels)))
        }
        _ => false,
    };
    Outcome::labels_kept(
        group,
        ops,
        driver_before,
        by_others || kept || after.is_some_and(|d| d.selects(labels, version)),
    )
}

/// The nodeSelectors of the driver DaemonSets `d` controls now, when the operator's DaemonSets
/// were read.
fn live_selectors<'f>(facts: &'f ClusterFacts, d: &NvidiaDriver) -> Option<&'f [Labels]> {
    let all = facts.nvidia_driver_daemonsets.as_ref()?;
    Some(all.get(&d.name).map_or(&[], Vec::as_slice))
}

/// Whether a driver DaemonSet of `d` runs on a node with these labels now: what its selector
/// renders, or one it controls (when they were read) selects the node, such as a pool an
/// earlier change dropped and the operator kept. Both count, so that a DaemonSet not listed
/// yet still counts as running.
fn serves_now(facts: &ClusterFacts, d: &NvidiaDriver, labels: &Labels) -> bool {
    d.selects(labels, &facts.operator.version)
        || live_selectors(facts, d)
            .is_some_and(|live| live.iter().any(|sel| selector_matches(sel, labels)))
}

/// Every state rule, before and after, on every group: a finding only the new state has is
/// one the request creates.
fn state_transitions(
    review: &PolicyReview<'_>,
    object: &str,
    outcomes: &[Outcome<'_, '_>],
    policy: &Policy,
    out: &mut Vec<Found>,
) {
    let (before_facts, after_facts, toolkit_removed) = match review.change {
        PolicyChange::ClusterPolicy {
            before,
            after,
            host_toolkit,
            ..
        } => (
            before,
            after,
            before.toolkit_managed && !after.toolkit_managed && host_toolkit.is_none(),
        ),
        PolicyChange::GpuCluster { facts, after, .. } => (facts, after, false),
        PolicyChange::NvidiaDriver { .. } => return,
    };
    // `spec.toolkit.enabled` false says the hosts bring the toolkit; switched off under running
    // operands it says nothing of the kind: the toolkit that ran exits and removes the `nvidia`
    // runtime its operands' pods (GFD, DCGM, the exporter, the MIG manager, the validator) use.
    // So the state after is judged without a toolkit, unless the request says the hosts bring
    // one. Nodes whose device plugin stays are `toolkit-switched-off`'s.
    let toolkit_gone;
    let after_facts = if toolkit_removed {
        toolkit_gone = ClusterFacts {
            toolkit_managed: true,
            ..after_facts.clone()
        };
        &toolkit_gone
    } else {
        after_facts
    };
    let mut by_rule: BTreeMap<Rule, (Vec<&str>, String)> = BTreeMap::new();
    for o in outcomes {
        let sample = o.group.nodes.first().copied().unwrap_or_default();
        let had: Vec<Rule> = policy::assess(
            sample,
            &o.before_labels,
            &o.group.placement,
            before_facts,
            policy,
        )
        .into_iter()
        .map(|f| f.rule)
        .collect();
        for f in policy::assess(
            sample,
            &o.after_labels,
            &o.group.placement,
            after_facts,
            policy,
        ) {
            // Where the device plugin stays, `toolkit-switched-off` already says what the
            // toolkit's exit does to the node.
            let said = toolkit_removed
                && (f.rule == Rule::DevicePluginWithoutToolkit
                    || (f.rule == Rule::OperandWithoutToolkit
                        && o.after.contains(Operand::DevicePlugin)));
            if had.contains(&f.rule) || said {
                continue;
            }
            let entry = by_rule
                .entry(f.rule)
                .or_insert_with(|| (Vec::new(), f.message.clone()));
            entry.0.extend(o.group.nodes.iter().copied());
        }
    }
    for (rule, (nodes, first)) in by_rule {
        let (count, names) = name_nodes(nodes);
        out.push(finding(
            rule,
            format!(
                "{object}: after this change, {count} {} fail {} ({names}); for example: {first}",
                plural(count),
                rule.id()
            ),
            format!(
                "{object}: {} on {count} {} ({names})",
                rule.id(),
                plural(count)
            ),
        ));
    }
}

#[cfg(test)]
mod tests;
