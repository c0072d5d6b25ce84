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
use super::operator::labelling_pass;
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
}

impl PolicyKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::ClusterPolicy => "ClusterPolicy",
            PolicyKind::NvidiaDriver => "NVIDIADriver",
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

    /// Whether its driver DaemonSets run on a node with these labels: the deploy label, a GPU,
    /// its node selector, and the NFD labels that put the node in a pool.
    pub fn selects(&self, labels: &Labels) -> bool {
        let pooled = NFD_OS_KEYS.iter().all(|k| labels.contains_key(*k))
            && (!self.precompiled || labels.contains_key(NFD_KERNEL_KEY));
        let key = if self.vgpu_host_manager {
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
        PolicyChange::NvidiaDriver { facts, .. } => facts,
    };
    if review.operation != Operation::Delete || review.kind == PolicyKind::NvidiaDriver {
        match fleet {
            Fleet::Known { groups, keeps } => {
                let outcomes: Vec<Outcome<'_, '_>> =
                    groups.iter().map(|g| outcome(review, g)).collect();
                judge(review, &outcomes, policy, &mut findings);
                unkept_selector_keys(review, keeps, &mut findings);
            }
            Fleet::Unknown(why) => judge_blind(review, why, &mut findings),
        }
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
                let old = labelling_pass(labels, before.version.era, &before.sandbox).labels;
                let new = labelling_pass(labels, after.version.era, &after.sandbox).labels;
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
                before.version.era >= Era::V26_7
                    && !before.driver_crd
                    && policy::simulate(labels, before).contains(Operand::Driver)
            };
            let driver = |facts: &ClusterFacts, ops: OperandSet, labels: &Labels| {
                if facts.driver_crd {
                    drivers.iter().any(|d| d.selects(labels)) || orphaned(labels)
                } else {
                    ops.contains(Operand::Driver)
                }
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
        PolicyChange::NvidiaDriver {
            facts,
            before,
            after,
            others,
        } => {
            let ops = policy::simulate(labels, facts);
            let by_others = others.iter().any(|d| d.selects(labels));
            let before_here = before.is_some_and(|d| d.selects(labels));
            // Before v26.3 a pool the new selector drops keeps its DaemonSet running
            // (`docs/gpu-operator.md` §11.4); a deleted resource's DaemonSets always go.
            let kept = after.is_some() && before_here && facts.version.era < Era::V26_3;
            Outcome {
                group,
                driver_before: by_others || before_here,
                driver_after: by_others || kept || after.is_some_and(|d| d.selects(labels)),
                before_labels: labels.clone(),
                after_labels: labels.clone(),
                before: ops,
                after: ops,
                relabel_before: ops,
                relabel_after: ops,
            }
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
        .map(|n| super::echo::echo(n).into_owned())
        .collect();
    let text = match all.len().saturating_sub(NAMED_NODES) {
        0 => shown.join(", "),
        more => format!("{} and {more} more", shown.join(", ")),
    };
    (all.len(), text)
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "node" } else { "nodes" }
}

/// "loses" for one node, "lose" for several.
fn lose(n: usize) -> &'static str {
    if n == 1 { "loses" } else { "lose" }
}

fn finding(rule: Rule, message: String, warning: String) -> Found {
    Found {
        rule,
        change: Change::New,
        message,
        warning,
    }
}

fn judge(
    review: &PolicyReview<'_>,
    outcomes: &[Outcome<'_, '_>],
    policy: &Policy,
    out: &mut Vec<Found>,
) {
    let object = format!(
        "{} {}",
        review.kind.as_str(),
        super::echo::echo(review.name)
    );
    if let PolicyChange::ClusterPolicy {
        before,
        after,
        others,
        ..
    } = review.change
    {
        if review.operation == Operation::Create
            && let Some(first) = others.first()
        {
            let msg = format!(
                "{object}: ClusterPolicy {} already exists; the GPU Operator follows one ClusterPolicy and marks the others ignored.",
                super::echo::echo(first)
            );
            out.push(finding(Rule::ClusterPolicyIgnored, msg.clone(), msg));
            return;
        }
        toolkit_switched_off(&object, before, after, outcomes, out);
        device_plugin_switched_off(&object, before, after, outcomes, out);
        if before.sandbox != after.sandbox {
            sandbox_relabel(&object, before, after, outcomes, out);
        }
        if let PolicyChange::ClusterPolicy { drivers, .. } = review.change {
            driver_selected_twice(&object, before, after, drivers, outcomes, out);
        }
        runtime_classes_removed(&object, before, after, outcomes, out);
    }
    driver_removed(review, &object, outcomes, out);
    if let PolicyChange::NvidiaDriver {
        after: Some(this),
        others,
        facts,
        ..
    } = review.change
    {
        overlap(&object, facts, this, others, outcomes, out);
    }
    state_transitions(review, &object, outcomes, policy, out);
}

fn toolkit_switched_off(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if !before.toolkit_managed || after.toolkit_managed {
        return;
    }
    let hit = outcomes.iter().filter(|o| {
        o.before.contains(Operand::ContainerToolkit)
            && o.after.contains(Operand::DevicePlugin)
            && !o.after.contains(Operand::ContainerToolkit)
    });
    let (count, names) = name_nodes(hit.flat_map(|o| o.group.nodes.iter().copied()));
    if count == 0 {
        return;
    }
    out.push(finding(
        Rule::ToolkitSwitchedOff,
        toolkit_message(object, &format!("on {count} {} ({names})", plural(count))),
        format!(
            "{object}: toolkit off while the device plugin runs on {count} {}",
            plural(count)
        ),
    ));
}

/// §11.6: `devicePlugin.enabled` true -> false. Consistent (nothing runs without the toolkit),
/// but every node it ran on stops advertising its GPUs.
fn device_plugin_switched_off(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if before.off().contains(Operand::DevicePlugin) || !after.off().contains(Operand::DevicePlugin)
    {
        return;
    }
    let hit = outcomes.iter().filter(|o| {
        o.before.contains(Operand::DevicePlugin) && !o.after.contains(Operand::DevicePlugin)
    });
    let (count, names) = name_nodes(hit.flat_map(|o| o.group.nodes.iter().copied()));
    if count == 0 {
        return;
    }
    out.push(finding(
        Rule::DevicePluginSwitchedOff,
        format!(
            "{object}: spec.devicePlugin.enabled true -> false deletes the device plugin DaemonSets (the MPS control daemon's too) on {count} {} ({names}): \
             their GPUs are no longer advertised, so new GPU pods stay Pending there (running ones keep their GPUs), \
             and the operator validator rolls without its plugin check.",
            plural(count)
        ),
        format!(
            "{object}: the device plugin stops on {count} {} ({names}); their GPUs are no longer advertised",
            plural(count)
        ),
    ));
}

/// §11.3: `driver.useNvidiaDriverCRD` true -> false. The ClusterPolicy's driver DaemonSet comes
/// back while the NVIDIADriver DaemonSets stay (v26.3+ set the resources `disabled` and leave
/// them; v25.3/v25.10 go on reconciling them).
fn driver_selected_twice(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    drivers: &[NvidiaDriver],
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if !before.driver_crd || after.driver_crd {
        return;
    }
    // The nodes the ClusterPolicy's driver comes back on that an NVIDIADriver serves, and which
    // NVIDIADrivers those are.
    let mut serving = std::collections::BTreeSet::new();
    let mut nodes = Vec::new();
    for o in outcomes
        .iter()
        .filter(|o| o.after.contains(Operand::Driver))
    {
        if let Some(d) = drivers.iter().find(|d| d.selects(&o.after_labels)) {
            serving.insert(d.name.as_str());
            nodes.extend(o.group.nodes.iter().copied());
        }
    }
    let (count, names) = name_nodes(nodes);
    if count == 0 {
        return;
    }
    let resources =
        super::echo::echo(&serving.into_iter().collect::<Vec<_>>().join(", ")).into_owned();
    let kept = if after.version.era >= Era::V26_3 {
        "the operator sets them disabled and leaves their DaemonSets"
    } else {
        "this operator version goes on reconciling them"
    };
    out.push(finding(
        Rule::DriverSelectedTwice,
        format!(
            "{object}: driver.useNvidiaDriverCRD true -> false brings nvidia-driver-daemonset back on {count} {} ({names}) that the DaemonSets of NVIDIADriver {resources} still serve ({kept}): \
             one driver pod runs per node (pod anti-affinity), so its pods stay Pending there, and deleting those NVIDIADriver resources later restarts the driver under the nodes' GPU workloads; \
             delete them first, node by node during a drain, or keep the flag on.",
            plural(count)
        ),
        format!(
            "{object}: {count} {} served by NVIDIADriver {resources} get nvidia-driver-daemonset too ({names})",
            plural(count)
        ),
    ));
}

/// §11.6: `cdi.nriPluginEnabled` false -> true from v26.3: the operator deletes the `nvidia`
/// RuntimeClasses, and the API server refuses pods that name one.
fn runtime_classes_removed(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    if after.version.era < Era::V26_3 || before.nri_plugin || !after.nri_plugin {
        return;
    }
    let toolkit = outcomes
        .iter()
        .filter(|o| o.after.contains(Operand::ContainerToolkit))
        .map(|o| o.group.nodes.len())
        .sum::<usize>();
    out.push(finding(
        Rule::RuntimeClassesRemoved,
        format!(
            "{object}: cdi.nriPluginEnabled false -> true makes the GPU Operator delete the RuntimeClasses nvidia, nvidia-cdi and nvidia-legacy \
             (the toolkit on {toolkit} {} becomes an NRI plugin): from then on the API server refuses every pod that names runtimeClassName: nvidia \
             (running ones keep running); remove runtimeClassName from GPU workloads and their templates first.",
            plural(toolkit)
        ),
        format!(
            "{object}: the nvidia RuntimeClasses are deleted; pods naming runtimeClassName: nvidia are refused from then on"
        ),
    ));
}

fn toolkit_message(object: &str, where_: &str) -> String {
    format!(
        "{object}: spec.toolkit.enabled true -> false deletes the container toolkit DaemonSet while the NVIDIA device plugin keeps running {where_}: \
         on containerd nodes the toolkit's exit removes the nvidia runtime (and with CDI on, the device plugin's rollout stalls on it), \
         the running device plugins keep advertising GPUs, and GPU pods scheduled there fail to start; turn spec.devicePlugin.enabled off in the same change, or, if every host brings its own \
         container toolkit, say so in the same request with the annotation {HOST_TOOLKIT_ANNOTATION}=<why> (recorded in the audit log)."
    )
}

fn sandbox_relabel(
    object: &str,
    before: &ClusterFacts,
    after: &ClusterFacts,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    // Nodes grouped by what changes on them.
    let mut by_change: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for o in outcomes {
        let mut changes = Vec::new();
        for op in Operand::all() {
            match (o.relabel_before.contains(op), o.relabel_after.contains(op)) {
                (false, true) => changes.push(format!("+{op}")),
                (true, false) => changes.push(format!("-{op}")),
                _ => {}
            }
        }
        if !changes.is_empty() {
            by_change
                .entry(changes.join(" "))
                .or_default()
                .extend(o.group.nodes.iter().copied());
        }
    }
    let what = sandbox_words(before, after);
    for (changes, nodes) in by_change {
        let (count, names) = name_nodes(nodes);
        out.push(finding(
            Rule::SandboxRelabel,
            format!(
                "{object}: {what} makes the GPU Operator relabel {count} {} on its next pass ({names}): {changes}.",
                plural(count)
            ),
            format!(
                "{object}: {what}: {changes} on {count} {}",
                plural(count)
            ),
        ));
    }
}

fn sandbox_words(before: &ClusterFacts, after: &ClusterFacts) -> String {
    let (b, a) = (&before.sandbox, &after.sandbox);
    let mut parts = Vec::new();
    if b.enabled != a.enabled {
        parts.push(format!(
            "sandboxWorkloads.enabled {} -> {}",
            b.enabled, a.enabled
        ));
    }
    if b.default_workload != a.default_workload {
        let w = |w: Option<super::operands::Workload>| {
            w.map_or("none".to_owned(), |w| w.name().to_owned())
        };
        parts.push(format!(
            "sandboxWorkloads.defaultWorkload {} -> {}",
            w(b.default_workload),
            w(a.default_workload)
        ));
    }
    if b.mode != a.mode {
        parts.push(format!(
            "sandboxWorkloads.mode {} -> {}",
            b.mode.name(),
            a.mode.name()
        ));
    }
    parts.join(", ")
}

fn driver_removed(
    review: &PolicyReview<'_>,
    object: &str,
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    let lost = outcomes
        .iter()
        .filter(|o| o.driver_before && !o.driver_after)
        .flat_map(|o| o.group.nodes.iter().copied());
    let (count, names) = name_nodes(lost);
    if count == 0 {
        return;
    }
    let how = match review.change {
        PolicyChange::ClusterPolicy { before, after, .. } => {
            if !before.driver_crd && after.driver_crd {
                "driver.useNvidiaDriverCRD hands the driver to NVIDIADriver resources, and none selects them"
            } else {
                "spec.driver.enabled true -> false deletes nvidia-driver-daemonset"
            }
        }
        PolicyChange::NvidiaDriver { after: None, .. } => {
            "deleting it removes its driver DaemonSets, and no other NVIDIADriver selects them"
        }
        PolicyChange::NvidiaDriver { .. } => {
            "its nodeSelector no longer selects them, and no other NVIDIADriver does"
        }
    };
    out.push(finding(
        Rule::DriverRemoved,
        format!(
            "{object}: {how}: {count} {} {} the driver DaemonSet ({names}); the driver container unloads the kernel modules as it exits, \
             so nodes without a driver installed on the host lose their GPUs.",
            plural(count),
            lose(count)
        ),
        format!(
            "{object}: {count} {} {} the driver DaemonSet ({names})",
            plural(count),
            lose(count)
        ),
    ));
}

fn overlap(
    object: &str,
    facts: &ClusterFacts,
    this: &NvidiaDriver,
    others: &[NvidiaDriver],
    outcomes: &[Outcome<'_, '_>],
    out: &mut Vec<Found>,
) {
    for other in others {
        // From v26.7 a default NVIDIADriver takes the nodes no other one claims: sharing a node
        // with a non-default one is the design, not a conflict (`AssignOwners`). Two defaults
        // conflict, as two non-defaults do.
        if facts.version.era >= Era::V26_7 && this.default != other.default {
            continue;
        }
        let shared = outcomes
            .iter()
            .filter(|o| this.claims(&o.after_labels) && other.claims(&o.after_labels))
            .flat_map(|o| o.group.nodes.iter().copied());
        let (count, names) = name_nodes(shared);
        if count == 0 {
            continue;
        }
        out.push(finding(
            Rule::NvidiaDriverOverlap,
            format!(
                "{object}: {} {count} {} that NVIDIADriver {} selects too ({names}); the GPU Operator runs one driver per node \
                 and reports the conflict only when it reconciles: make the two nodeSelectors select different nodes.",
                if this.node_selector.is_some() {
                    "its nodeSelector selects"
                } else {
                    "with no nodeSelector it claims every GPU node, among them"
                },
                plural(count),
                super::echo::echo(&other.name)
            ),
            format!(
                "{object} and NVIDIADriver {} both select {names}",
                super::echo::echo(&other.name)
            ),
        ));
    }
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
    let (before_facts, after_facts) = match review.change {
        PolicyChange::ClusterPolicy { before, after, .. } => (before, after),
        PolicyChange::NvidiaDriver { .. } => return,
    };
    let mut by_rule: BTreeMap<Rule, (Vec<&str>, String)> = BTreeMap::new();
    for o in outcomes {
        let sample = o.group.nodes.first().copied().unwrap_or_default();
        let had: Vec<Rule> = policy::assess(sample, &o.before_labels, before_facts, policy)
            .into_iter()
            .map(|f| f.rule)
            .collect();
        for f in policy::assess(sample, &o.after_labels, after_facts, policy) {
            if had.contains(&f.rule) {
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

/// An NVIDIADriver whose nodeSelector names a label the node records do not hold yet (they
/// keep what decisions read, and the keys of the NVIDIADrivers that exist): its nodes cannot be
/// told, so overlap and lost drivers are not judged for them, and the warning says so. Once
/// the resource exists, the records keep that key too.
fn unkept_selector_keys(
    review: &PolicyReview<'_>,
    keeps: &dyn Fn(&str) -> bool,
    out: &mut Vec<Found>,
) {
    let PolicyChange::NvidiaDriver {
        after: Some(this),
        before,
        others,
        ..
    } = review.change
    else {
        return;
    };
    // Alone and new, it can overlap nothing and take no driver away: nothing went unchecked.
    if others.is_empty() && before.is_none() {
        return;
    }
    let unkept: Vec<&str> = this
        .node_selector
        .iter()
        .flat_map(|s| s.keys())
        .map(String::as_str)
        .filter(|k| !keeps(k))
        .collect();
    if unkept.is_empty() {
        return;
    }
    let object = format!("NVIDIADriver {}", super::echo::echo(review.name));
    let keys = super::echo::echo(&unkept.join(", ")).into_owned();
    let mut f = finding(
        Rule::NvidiaDriverOverlap,
        format!(
            "{object}: its nodeSelector reads {keys}, which the guard has not read from the nodes yet: \
             which nodes it selects, and so overlaps with other NVIDIADrivers, were not checked for this request; \
             the guard reads that label from now on."
        ),
        format!("{object}: overlap not checked: the guard does not read {keys} yet"),
    );
    // Not a violation found, a check not made: never a refusal.
    f.change = Change::Existing;
    out.push(f);
}

/// Without the nodes, what the policy alone says: the toolkit switched off while the device
/// plugin stays enabled is refused (it runs wherever its label is), the rest is not judged.
fn judge_blind(review: &PolicyReview<'_>, why: &str, out: &mut Vec<Found>) {
    if let PolicyChange::ClusterPolicy { before, after, .. } = review.change
        && before.toolkit_managed
        && !after.toolkit_managed
        && !after.off().contains(Operand::DevicePlugin)
    {
        let object = format!(
            "{} {}",
            review.kind.as_str(),
            super::echo::echo(review.name)
        );
        out.push(finding(
            Rule::ToolkitSwitchedOff,
            toolkit_message(
                &object,
                &format!("wherever its deploy label is (the nodes are not known: {why})"),
            ),
            format!("{object}: toolkit off while the device plugin stays enabled"),
        ));
    }
}

#[cfg(test)]
mod tests;
