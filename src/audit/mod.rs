//! The audit: which operands each node should run, which it does run, and what
//! is broken, from one list of nodes and one list of the operator's pods.
//!
//! [`audit`] is pure: no I/O, no clock. Printing ([`output`]), the
//! ClusterPolicyReport ([`report`]), writing it to the cluster ([`apply`]) and
//! the `/metrics` gauges ([`metrics`]) are shells around it. Its input comes
//! from files or the API (`k8s`), or from the stores of `serve`'s cluster watch.
//! The label rules come from [`policy::assess`], the webhook's own code, so the
//! audit and the webhook never disagree about a node.

pub mod apply;
pub mod incremental;
pub mod metrics;
pub mod output;
pub mod report;

use std::borrow::Borrow;
use std::collections::HashMap;

use serde::Serialize;

use crate::core::advertised::{Advertised, GFD_COUNT_KEY};
use crate::core::dra::DraNodes;
use crate::core::facts::ClusterFacts;
use crate::core::lasting::History;
use crate::core::operands::{Labels, Operand, OperandSet, is_gpu_node};
use crate::core::placement::{NodePlacement, PlacementState};
pub use crate::core::pods::OperandState;
use crate::core::policy::{self, Policy};
use crate::core::rules::{Action, PodCtx, Rule, Severity};
use crate::k8s::daemonset::{is_daemonset_pod, operand_of_pod};
use crate::k8s::node::NodeView;
use crate::k8s::pod::{PodOnNode, PodPhase, PodView};

/// How bad a finding is, in the words of a PolicyReport result.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Fail,
    Warn,
}

/// What a finding was concluded from.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Basis {
    /// The pods actually running on the node.
    Pods,
    /// The node's labels, as the webhook judges them.
    Labels,
    /// How long the node's pauses and upgrade states have lasted, as this guard has watched
    /// them (`serve`'s continuous audit only).
    History,
    /// What the node's status advertises (its allocatable GPUs), beside the pods that run.
    Status,
}

impl Basis {
    /// Seen on the cluster (the pods, or a state that has lasted), not implied by labels.
    pub fn is_observed(self) -> bool {
        self != Basis::Labels
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AuditFinding {
    pub rule: Rule,
    pub level: Level,
    pub basis: Basis,
    pub message: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeAudit {
    pub name: String,
    /// The operator sees an NVIDIA GPU on it.
    pub gpu: bool,
    /// The report's columns, then any other operand expected or with a pod here.
    pub operands: Vec<OperandState>,
    pub findings: Vec<AuditFinding>,
}

impl NodeAudit {
    pub fn operand(&self, op: Operand) -> Option<&OperandState> {
        self.operands.iter().find(|s| s.operand == op)
    }

    pub fn running(&self, op: Operand) -> bool {
        self.operand(op).is_some_and(|s| s.running)
    }

    /// Expected operands without a Running pod.
    pub fn missing(&self) -> impl Iterator<Item = Operand> + '_ {
        self.operands
            .iter()
            .filter(|s| s.expected && !s.running)
            .map(|s| s.operand)
    }

    /// The rules the node's pods break whose rows call the failure high: pairings that leave
    /// GPU pods unable to start (the device plugin without the toolkit), not just an operand
    /// missing.
    pub fn broken(&self) -> impl Iterator<Item = Rule> + '_ {
        self.findings
            .iter()
            .filter(|f| f.basis == Basis::Pods && f.rule.spec().severity == Severity::High)
            .map(|f| f.rule)
    }

    pub fn has(&self, rule: Rule) -> bool {
        self.findings.iter().any(|f| f.rule == rule)
    }

    /// Nothing missing, and no rule broken on the pods or by how long a state has lasted.
    pub fn is_ok(&self) -> bool {
        self.missing().next().is_none() && !self.findings.iter().any(|f| f.basis.is_observed())
    }
}

/// What the gauges, the exit code and the report's counts read of one node's audit: its
/// operands as three sets and its findings without their messages. A fleet's audit is kept as
/// these (about 80 bytes a node); a node's whole [`NodeAudit`] is made again when its messages
/// are needed ([`Context::node`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSummary {
    pub name: Box<str>,
    pub gpu: bool,
    pub expected: OperandSet,
    pub running: OperandSet,
    /// Operands with a pod here, whatever its phase.
    pub with_pod: OperandSet,
    /// Operands running under an untolerated `NoSchedule` taint: kept, never re-created.
    pub not_recreated: OperandSet,
    /// Operands a taint keeps off: evicted (`NoExecute`) or never placed (`NoSchedule`, no pod).
    pub held_off: OperandSet,
    /// Each finding's rule, level and basis, in the audit's order.
    pub findings: Box<[(Rule, Level, Basis)]>,
}

impl NodeSummary {
    /// Expected operands without a Running pod.
    pub fn missing(&self) -> OperandSet {
        self.expected.without(self.running)
    }

    pub fn has(&self, rule: Rule) -> bool {
        self.findings.iter().any(|f| f.0 == rule)
    }

    /// The level of the node's first finding of `rule`.
    pub fn level(&self, rule: Rule) -> Option<Level> {
        self.findings.iter().find(|f| f.0 == rule).map(|f| f.1)
    }

    /// Nothing missing, and no rule broken on the pods or by how long a state has lasted
    /// ([`NodeAudit::is_ok`]).
    pub fn is_ok(&self) -> bool {
        self.missing().is_empty() && !self.findings.iter().any(|f| f.2.is_observed())
    }

    /// A missing operand, or a finding that fails.
    pub fn fails(&self) -> bool {
        !self.missing().is_empty() || self.findings.iter().any(|f| f.1 == Level::Fail)
    }

    /// The node takes part in the GPU stack: the report lists it.
    pub fn is_relevant(&self) -> bool {
        self.gpu
            || !self.findings.is_empty()
            || !self.expected.is_empty()
            || !self.with_pod.is_empty()
    }
}

impl NodeAudit {
    pub fn summary(&self) -> NodeSummary {
        let set = |keep: fn(&OperandState) -> bool| -> OperandSet {
            self.operands
                .iter()
                .filter(|s| keep(s))
                .map(|s| s.operand)
                .collect()
        };
        NodeSummary {
            name: self.name.as_str().into(),
            gpu: self.gpu,
            expected: set(|s| s.expected),
            running: set(|s| s.running),
            with_pod: set(|s| s.pod.is_some()),
            not_recreated: set(|s| s.placement == Some(PlacementState::StaysNotRecreated)),
            held_off: set(|s| {
                matches!(
                    s.placement,
                    Some(PlacementState::Evicted | PlacementState::NotPlaced)
                )
            }),
            findings: self
                .findings
                .iter()
                .map(|f| (f.rule, f.level, f.basis))
                .collect(),
        }
    }
}

/// A fleet's audit as kept by the continuous audit: every node's [`NodeSummary`], and what
/// their audits shared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FleetAudit {
    /// Sorted by name.
    pub nodes: Vec<NodeSummary>,
    pub columns: Vec<Operand>,
    pub running_daemonset_pods: usize,
    pub facts: ClusterFacts,
    pub rules: Vec<Rule>,
}

impl FleetAudit {
    /// Number of nodes with a finding of `rule`.
    pub fn count(&self, rule: Rule) -> usize {
        self.nodes.iter().filter(|n| n.has(rule)).count()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditReport {
    /// Sorted by name.
    pub nodes: Vec<NodeAudit>,
    /// Operands shown for every node: those always shown, then those whose DaemonSet exists.
    pub columns: Vec<Operand>,
    /// Running DaemonSet pods in the namespace (the matrix's `TOTAL_PODS`).
    pub running_daemonset_pods: usize,
    pub facts: ClusterFacts,
    /// The rules evaluated: every state rule ([`Rule::state_rules`]) the policy does not switch
    /// off.
    pub rules: Vec<Rule>,
}

impl AuditReport {
    /// 0 when every node is clean, 1 when an operand is missing or a pairing is broken.
    pub fn exit_code(&self) -> u8 {
        if self.nodes.iter().all(NodeAudit::is_ok) {
            0
        } else {
            1
        }
    }

    pub fn node(&self, name: &str) -> Option<&NodeAudit> {
        self.nodes
            .binary_search_by(|n| n.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Number of nodes with a finding of `rule`.
    pub fn count(&self, rule: Rule) -> usize {
        self.nodes.iter().filter(|n| n.has(rule)).count()
    }

    /// The report as the continuous audit keeps it.
    pub fn summary(&self) -> FleetAudit {
        FleetAudit {
            nodes: self.nodes.iter().map(NodeAudit::summary).collect(),
            columns: self.columns.clone(),
            running_daemonset_pods: self.running_daemonset_pods,
            facts: self.facts.clone(),
            rules: self.rules.clone(),
        }
    }
}

/// What every node's audit shares: the facts with the evidence of the pods applied, the
/// report's columns and the rules evaluated. Built once per pass ([`audit`]), or kept by an
/// incremental auditor and rebuilt only when the facts or the operands with pods change.
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    pub facts: ClusterFacts,
    pub columns: Vec<Operand>,
    pub rules: Vec<Rule>,
}

impl Context {
    /// `seen`: the operands that have at least one pod in the namespace.
    pub fn new(facts: &ClusterFacts, seen: OperandSet, policy: &Policy) -> Context {
        let present = facts.daemonsets.unwrap_or(seen);
        // Evidence beats defaults: an operand whose pods (through their owner) or DaemonSet the
        // cluster shows is enabled, even where the ClusterPolicy's defaults say it is off.
        let mut facts = facts.clone();
        facts.enable_seen(seen);
        let columns = Operand::always_shown()
            .chain(Operand::all().filter(|op| present.contains(*op) && !op.info().always_shown))
            .collect();
        // A rule on the ResourceSlices is evaluated only where they were read: the report
        // would call it passed.
        let slices_read = matches!(facts.dra_nodes, DraNodes::Known(_));
        let plugins_read = facts.foreign_plugins.known().is_some();
        let rules = Rule::state_rules()
            .filter(|rule| policy.action(*rule) != Action::Off)
            .filter(|rule| slices_read || !rule.reads_slices())
            .filter(|rule| plugins_read || !rule.reads_foreign_plugins())
            .collect();
        Context {
            facts,
            columns,
            rules,
        }
    }

    /// One node's audit: `pods` are the operand pods scheduled on it.
    pub fn node(&self, node: NodeIn<'_>, pods: &[PodOnNode<'_>], policy: &Policy) -> NodeAudit {
        audit_node(node, pods, &self.columns, &self.facts, policy)
    }
}

/// Audits every node against the operator's pods. O(nodes + pods): pods are indexed by node once.
/// Nothing has been watched, so the rules on how long a state lasted
/// ([`Rule::reads_history`]) are not evaluated.
pub fn audit<N: Borrow<NodeView>, P: Borrow<PodView>>(
    nodes: &[N],
    pods: &[P],
    facts: &ClusterFacts,
    policy: &Policy,
) -> AuditReport {
    let mut by_node: HashMap<&str, Vec<PodOnNode<'_>>> = HashMap::new();
    let mut seen = OperandSet::EMPTY;
    let mut running_daemonset_pods = 0;
    for pod in pods {
        let pod = pod.borrow();
        if pod.is_running() && is_daemonset_pod(pod) {
            running_daemonset_pods += 1;
        }
        let Some(op) = operand_of_pod(pod) else {
            continue;
        };
        seen.insert(op);
        if let Some(node) = pod.node.as_deref() {
            by_node.entry(node).or_default().push(PodOnNode {
                operand: op,
                name: pod.name().into(),
                phase: pod.phase,
            });
        }
    }
    let mut ctx = Context::new(facts, seen, policy);
    // One pass has watched nothing: no rule on how long a state lasted is evaluated (the
    // report would call it passed).
    ctx.rules.retain(|rule| !rule.reads_history());
    let mut out: Vec<NodeAudit> = nodes
        .iter()
        .map(|n| {
            let n = n.borrow();
            let pods = by_node.get(n.name()).map_or(&[][..], Vec::as_slice);
            let node = NodeIn {
                name: n.name(),
                labels: n.labels(),
                placement: &n.placement,
                history: History::NONE,
                advertised: n.advertised,
            };
            ctx.node(node, pods, policy)
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    AuditReport {
        nodes: out,
        columns: ctx.columns,
        running_daemonset_pods,
        facts: ctx.facts,
        rules: ctx.rules,
    }
}

/// A node as the audit reads it: name, labels, taints and cordon, and how long its timed
/// labels have lasted ([`History::NONE`] when nothing has been watched).
#[derive(Clone, Copy)]
pub struct NodeIn<'a> {
    pub name: &'a str,
    pub labels: &'a Labels,
    pub placement: &'a NodePlacement,
    pub history: History<'a>,
    /// What its status advertises of NVIDIA GPUs (`None`: no status read).
    pub advertised: Option<Advertised>,
}

fn audit_node(
    node: NodeIn<'_>,
    pods: &[PodOnNode<'_>],
    columns: &[Operand],
    facts: &ClusterFacts,
    policy: &Policy,
) -> NodeAudit {
    let NodeIn { name, labels, .. } = node;
    let with_pods: OperandSet = pods.iter().map(|p| p.operand).collect();
    // Expected where the DaemonSet controller places the pod, or keeps the one there under a
    // taint it does not tolerate; not where a taint keeps a new one off or evicts it.
    let runs = policy::runs(name, labels, node.placement, Some(with_pods), facts);
    let expected: OperandSet = runs
        .set
        .iter()
        .filter(|op| op.info().has_daemonset())
        .filter(|op| facts.daemonsets.is_none_or(|ds| ds.contains(*op)))
        .collect();
    let operands: Vec<OperandState> = Operand::all()
        .filter(|op| columns.contains(op) || expected.contains(*op) || with_pods.contains(*op))
        .map(|op| {
            // Prefer a Running pod, then the most advanced phase, then the name: deterministic.
            let pod = pods
                .iter()
                .filter(|p| p.operand == op)
                .min_by(|a, b| (a.phase, &a.name).cmp(&(b.phase, &b.name)));
            OperandState {
                operand: op,
                placement: runs
                    .blocked
                    .get(&op)
                    .map(|p| p.state(with_pods.contains(op))),
                expected: expected.contains(op),
                running: pod.is_some_and(|p| p.phase == PodPhase::Running),
                pod: pod.map(|p| p.name.to_string()),
                phase: pod.map(|p| p.phase),
            }
        })
        .collect();
    let mut audit = NodeAudit {
        name: name.to_owned(),
        gpu: is_gpu_node(labels),
        operands,
        findings: Vec::new(),
    };
    audit.findings = findings(&audit, node, facts, policy);
    audit
}

fn findings(
    audit: &NodeAudit,
    node: NodeIn<'_>,
    facts: &ClusterFacts,
    policy: &Policy,
) -> Vec<AuditFinding> {
    let mut found = Vec::new();
    let pods = PodCtx {
        node: &audit.name,
        operands: &audit.operands,
        facts,
        history: node.history,
        advertised: node.advertised,
        gfd_count: node
            .labels
            .get(GFD_COUNT_KEY)
            .and_then(|v| v.trim().parse().ok()),
    };
    pods.run(|rule| policy.action(rule) != Action::Off, &mut found);
    let mut out: Vec<AuditFinding> = found
        .into_iter()
        .map(|f| AuditFinding {
            rule: f.rule,
            level: level(policy.action(f.rule)),
            basis: if f.rule.reads_history() {
                Basis::History
            } else if f.rule.reads_status() {
                Basis::Status
            } else {
                Basis::Pods
            },
            message: f.message,
        })
        .collect();
    for f in policy::assess(&audit.name, node.labels, node.placement, facts, policy) {
        let rule = f.rule;
        // What the pods show says more than what the labels imply.
        if out.iter().any(|o| o.rule == rule) {
            continue;
        }
        out.push(AuditFinding {
            rule,
            level: level(f.action),
            basis: Basis::Labels,
            message: f.message,
        });
    }
    out.sort_by_key(|f| f.rule);
    out
}

fn level(action: Action) -> Level {
    if action == Action::Deny {
        Level::Fail
    } else {
        Level::Warn
    }
}

#[cfg(test)]
mod tests;
