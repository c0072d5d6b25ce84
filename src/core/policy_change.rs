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
//! - `driver-removed` (warn): nodes lose their driver DaemonSet (`driver.enabled` off, the hand
//!   over to NVIDIADriver resources, an NVIDIADriver deleted or no longer selecting them).
//! - `sandbox-relabel` (warn): `sandboxWorkloads` swaps the operands of nodes.
//! - `nvidia-driver-overlap` (deny): an NVIDIADriver would select a node another one selects.
//! - every state rule of the label decision, transition-aware: a finding the change creates on
//!   some node is acted on with the rule's action, naming the nodes.

use std::collections::BTreeMap;

use super::facts::ClusterFacts;
use super::operands::Era;
use super::operands::{Labels, NFD_KERNEL_KEY, NFD_OS_KEYS, Operand, OperandSet};
use super::operator::{OperatorVersion, labelling_pass};
use super::policy::{self, Policy, Verdict};
use super::review::Operation;
use super::rules::{Action, Change, Found, Rule};

/// The annotation by which a ClusterPolicy change says the hosts bring their own container
/// toolkit: set (or changed) in the request that turns `spec.toolkit.enabled` off, it lets the
/// change through and is recorded in the audit annotations.
pub const HOST_TOOLKIT_ANNOTATION: &str = "gpu-deploy-guard.nvidia.com/toolkit-on-hosts";

/// Nodes named in one message at most; the rest are counted.
pub const NAMED_NODES: usize = 5;

/// The node label every `gpu` and `vgpu` driver DaemonSet selects besides its pool.
pub const DRIVER_DEPLOY_KEY: &str = "nvidia.com/gpu.deploy.driver";
/// The node label a `vgpu-host-manager` NVIDIADriver's DaemonSets select instead.
pub const VGPU_MANAGER_DEPLOY_KEY: &str = "nvidia.com/gpu.deploy.vgpu-manager";
const GPU_PRESENT: &str = "nvidia.com/gpu.present";

/// Which kind of GPU-policy object a request changes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    ClusterPolicy,
    NvidiaDriver,
    /// v26.7's DRA stack: judged only for whether it may exist beside a ClusterPolicy.
    GpuCluster,
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ClusterPolicy => "ClusterPolicy",
            PolicyKind::NvidiaDriver => "NVIDIADriver",
            PolicyKind::GpuCluster => "GPUCluster",
        }
    }
}

/// An NVIDIADriver resource as the decision reads it: which nodes it claims and where its
/// driver DaemonSets run (`docs/gpu-operator.md` §11.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvidiaDriver {
    pub name: String,
    /// `spec.nodeSelector`; absent means `nvidia.com/gpu.present: "true"`, while an empty one
    /// claims every node (`GetNodeSelector`).
    pub node_selector: Option<Labels>,
    /// `spec.driverType` is `vgpu-host-manager`: its DaemonSets select the vGPU manager's
    /// deploy label, not the driver's.
    pub vgpu_host_manager: bool,
    /// `spec.usePrecompiled`: its pools are per OS and kernel.
    pub precompiled: bool,
    /// `spec.default` (v26.7): it serves the GPU nodes no other NVIDIADriver claims.
    pub default: bool,
}

impl NvidiaDriver {
    fn matches(selector: &Labels, labels: &Labels) -> bool {
        selector
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
    }

    /// The nodes it claims, as the operator's overlap check reads them.
    pub fn claims(&self, labels: &Labels) -> bool {
        match &self.node_selector {
            Some(selector) => Self::matches(selector, labels),
            None => labels.get(GPU_PRESENT).is_some_and(|v| v == "true"),
        }
    }

    /// Whether its driver DaemonSets run on a node with these labels under the operator of
    /// this version: the deploy label, a GPU, its node selector, and the NFD labels that put
    /// the node in a pool. In v23.9 every driver type's DaemonSet selects the driver's deploy
    /// label; from v24.3 a `vgpu-host-manager` one selects the vGPU manager's
    /// (gpu-operator@v23.9.2, v24.3.0 `manifests/state-driver/0500_daemonset.yaml`).
    pub fn selects(&self, labels: &Labels, version: &OperatorVersion) -> bool {
        let pooled = NFD_OS_KEYS.iter().all(|k| labels.contains_key(*k))
            && (!self.precompiled || labels.contains_key(NFD_KERNEL_KEY));
        let key = if self.vgpu_host_manager && version.release >= (24, 3) {
            VGPU_MANAGER_DEPLOY_KEY
        } else {
            DRIVER_DEPLOY_KEY
        };
        pooled
            && labels.get(key).is_some_and(|v| v == "true")
            && labels.get(GPU_PRESENT).is_some_and(|v| v == "true")
            && self
                .node_selector
                .as_ref()
                .is_none_or(|selector| Self::matches(selector, labels))
    }
}

/// What the request changes.
#[derive(Clone, Copy, Debug)]
pub enum PolicyChange<'a> {
    ClusterPolicy {
        /// The facts under the old and the new object (for CREATE, `before` is the facts the
        /// cluster has now).
        before: &'a ClusterFacts,
        after: &'a ClusterFacts,
        /// [`HOST_TOOLKIT_ANNOTATION`], when this request sets or changes it.
        host_toolkit: Option<&'a str>,
        /// Other ClusterPolicy objects that exist (the operator follows one and ignores the rest).
        others: &'a [String],
        /// The NVIDIADriver resources, for the hand-over `driver.useNvidiaDriverCRD` makes.
        drivers: &'a [NvidiaDriver],
    },
    NvidiaDriver {
        facts: &'a ClusterFacts,
        /// This resource before (None for CREATE) and after (None for DELETE).
        before: Option<&'a NvidiaDriver>,
        after: Option<&'a NvidiaDriver>,
        /// Every other NVIDIADriver resource.
        others: &'a [NvidiaDriver],
    },
    GpuCluster {
        /// The facts the cluster has now, and those once the GPUCluster is as the request
        /// leaves it (for DELETE, the same).
        facts: &'a ClusterFacts,
        after: &'a ClusterFacts,
        /// The ClusterPolicy that exists, when one does.
        cluster_policy: Option<&'a str>,
    },
}

/// One request to judge.
#[derive(Clone, Copy, Debug)]
pub struct PolicyReview<'a> {
    pub kind: PolicyKind,
    pub name: &'a str,
    pub operation: Operation,
    pub username: &'a str,
    pub groups: &'a [String],
    pub dry_run: bool,
    pub change: PolicyChange<'a>,
}

/// Nodes with identical decision-relevant labels.
#[derive(Clone, Debug)]
pub struct NodeGroup<'a> {
    pub labels: Labels,
    /// Sorted.
    pub nodes: Vec<&'a str>,
}

/// The fleet the decision is made over.
#[derive(Clone, Copy)]
pub enum Fleet<'a> {
    /// The nodes, grouped; `keeps` says which label keys the groups hold (the records keep
    /// only what decisions read, so a selector may name a key they lack).
    Known {
        groups: &'a [NodeGroup<'a>],
        keeps: &'a dyn Fn(&str) -> bool,
    },
    /// The nodes are not read (yet): the decision falls back to the policy alone, and says why.
    Unknown(&'a str),
}

/// What runs on one group of nodes, before and after the change.
///
/// Before is what runs now: the nodes' labels under the old facts. After is what runs once the
/// change is applied: the same labels under the new facts, relabelled by the operator's pass
/// when the change alters the pass itself (`sandboxWorkloads`). What the pass would change
/// anyway is not the request's doing, and is left out.
struct Outcome<'g, 'a> {
    group: &'g NodeGroup<'a>,
    before_labels: Labels,
    after_labels: Labels,
    before: OperandSet,
    after: OperandSet,
    /// The operands after the pass under the old and the new sandbox settings (equal when the
    /// change leaves them alone): what a `sandboxWorkloads` change swaps.
    relabel_before: OperandSet,
    relabel_after: OperandSet,
    driver_before: bool,
    driver_after: bool,
}

/// Decides one GPU-policy change over the fleet.
pub fn decide_policy(review: &PolicyReview<'_>, fleet: Fleet<'_>, policy: &Policy) -> Verdict {
    let mut findings = Vec::new();
    let facts = match review.change {
        PolicyChange::ClusterPolicy { after, .. } => after,
        PolicyChange::NvidiaDriver { facts, .. } | PolicyChange::GpuCluster { facts, .. } => facts,
    };
    if let Some(conflict) = stacks_conflict(review) {
        // While both custom resources exist the operator reconciles nothing, so the request
        // changes nothing now. A ClusterPolicy change made then takes effect as soon as the
        // GPUCluster goes: it is judged as that, so that it cannot wait there to switch the
        // toolkit off.
        let existing = conflict.change == Change::Existing;
        findings.push(conflict);
        if existing
            && let PolicyChange::ClusterPolicy {
                before,
                after,
                host_toolkit,
                others,
                drivers,
            } = review.change
        {
            let before = before.clone().without_gpu_cluster();
            let after = after.clone().without_gpu_cluster();
            let alone = PolicyReview {
                change: PolicyChange::ClusterPolicy {
                    before: &before,
                    after: &after,
                    host_toolkit,
                    others,
                    drivers,
                },
                ..*review
            };
            judge_fleet(&alone, fleet, policy, &mut findings);
        }
    } else if review.kind == PolicyKind::GpuCluster
        && !matches!(review.change, PolicyChange::ClusterPolicy { .. })
    {
        // A GPUCluster alone is not judged over the fleet (its DELETE that hands the operator
        // to a ClusterPolicy is, as that ClusterPolicy's change).
    } else {
        // A ClusterPolicy's DELETE reaches here only when it hands the operator to another
        // ClusterPolicy (the webhook decides nothing of the others).
        judge_fleet(review, fleet, policy, &mut findings);
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
                if f.rule == Rule::ToolkitSwitchedOff && f.action == Action::Deny {
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

/// Judges `review` over the fleet, or on the policy alone when the nodes are not known.
fn judge_fleet(
    review: &PolicyReview<'_>,
    fleet: Fleet<'_>,
    policy: &Policy,
    findings: &mut Vec<Found>,
) {
    match fleet {
        Fleet::Known { groups, keeps } => {
            let outcomes: Vec<Outcome<'_, '_>> =
                groups.iter().map(|g| outcome(review, g)).collect();
            judge(review, &outcomes, policy, findings);
            unkept_selector_keys(review, keeps, findings);
        }
        Fleet::Unknown(why) => judge_blind(review, why, findings),
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
    let outcomes: Vec<Outcome<'_, '_>> = groups.iter().map(|g| outcome(review, g)).collect();
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

/// What the audit annotations say of a policy review.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyNote {
    /// `ClusterPolicy/<name>` or `NVIDIADriver/<name>`.
    pub object: String,
    /// Nodes the decision was made over; None when they were not known.
    pub nodes: Option<usize>,
    /// The host-toolkit statement that let a toolkit switch-off through.
    pub host_toolkit: Option<String>,
}

impl<'g, 'a> Outcome<'g, 'a> {
    /// A change that leaves the group's labels and operands as they are; only where a driver
    /// DaemonSet runs may differ.
    fn labels_kept(
        group: &'g NodeGroup<'a>,
        ops: OperandSet,
        driver_before: bool,
        driver_after: bool,
    ) -> Self {
        Outcome {
            group,
            driver_before,
            driver_after,
            before_labels: group.labels.clone(),
            after_labels: group.labels.clone(),
            before: ops,
            after: ops,
            relabel_before: ops,
            relabel_after: ops,
        }
    }
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

fn outcome<'g, 'a>(review: &PolicyReview<'_>, group: &'g NodeGroup<'a>) -> Outcome<'g, 'a> {
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
                before.operator.era() >= Era::V26_7
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
        } => {
            let ops = policy::simulate(labels, facts);
            let version = &facts.operator.version;
            let by_others = others.iter().any(|d| d.selects(labels, version));
            let before_here = before.is_some_and(|d| d.selects(labels, version));
            // Before v26.3 a pool the new selector drops keeps its DaemonSet running
            // (`docs/gpu-operator.md` §11.4); a deleted resource's DaemonSets always go.
            let kept = after.is_some() && before_here && facts.operator.era() < Era::V26_3;
            Outcome::labels_kept(
                group,
                ops,
                by_others || before_here,
                by_others || kept || after.is_some_and(|d| d.selects(labels, version)),
            )
        }
    }
}

pub mod judge;
use judge::{judge, judge_blind, stacks_conflict, unkept_selector_keys};

#[cfg(test)]
mod tests;
