//! The audit's text and JSON forms. Each takes a finished [`AuditReport`] and
//! only formats it.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::{AuditFinding, AuditReport, NodeAudit, OperandState};
use crate::core::facts::PolicySource;
use crate::core::operands::Operand;
use crate::core::placement::PlacementState;

/// `-o lines`: per node `<node> MISSING <operand>` for each gap or `<node> OK`, then
/// `<node> <rule>` for each high-severity rule its pods break (`device-plugin-without-toolkit`),
/// then `<node> PLACEMENT <operand> <state>` for each operand a taint holds (an untainted
/// fleet has none of these).
pub fn lines(report: &AuditReport) -> String {
    let mut out = String::new();
    for node in &report.nodes {
        let mut missing = node.missing().peekable();
        if missing.peek().is_none() {
            let _ = writeln!(out, "{} OK", node.name);
        }
        for op in missing {
            let _ = writeln!(out, "{} MISSING {op}", node.name);
        }
    }
    for node in &report.nodes {
        for rule in node.broken() {
            let _ = writeln!(out, "{} {rule}", node.name);
        }
    }
    for node in &report.nodes {
        for (op, state) in held(node) {
            let _ = writeln!(out, "{} PLACEMENT {op} {state}", node.name);
        }
    }
    out
}

/// The operands of `node` a taint holds, with their state (`stays-not-recreated`, `evicted`,
/// `not-placed`): what the DaemonSet controller will not (re-)create there.
fn held(node: &NodeAudit) -> impl Iterator<Item = (Operand, &'static str)> + '_ {
    node.operands.iter().filter_map(|s| match s.placement {
        Some(
            p @ (PlacementState::StaysNotRecreated
            | PlacementState::Evicted
            | PlacementState::NotPlaced),
        ) => Some((s.operand, p.as_str())),
        _ => None,
    })
}

/// `-o matrix`: per node `<column>=<yes|no>` for each column (yes: a Running pod there), and
/// on a node where a taint holds operands `PLACEMENT=<column>:<state>,…`; then
/// `TOTAL_PODS=<Running DaemonSet pods in the namespace>`.
pub fn matrix(report: &AuditReport) -> String {
    let mut out = String::new();
    for node in &report.nodes {
        out.push_str(&node.name);
        for op in &report.columns {
            let yes = if node.running(*op) { "yes" } else { "no" };
            let _ = write!(out, " {}={yes}", op.column());
        }
        let held: Vec<String> = held(node)
            .map(|(op, state)| format!("{}:{state}", op.column()))
            .collect();
        if !held.is_empty() {
            let _ = write!(out, " PLACEMENT={}", held.join(","));
        }
        out.push('\n');
    }
    let _ = writeln!(out, "TOTAL_PODS={}", report.running_daemonset_pods);
    out
}

/// `--order-check` for one node: the text to print and the exit code.
pub fn order_check(node: &NodeAudit) -> (String, u8) {
    match node.broken().next() {
        Some(rule) => (format!("{rule}\n"), 1),
        None => ("ok\n".to_owned(), 0),
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonReport<'a> {
    cluster_policy: JsonPolicy<'a>,
    /// Which custom resource drives the operator: cluster-policy, gpu-cluster or both.
    stack: &'static str,
    operator_version: JsonVersion<'a>,
    toolkit_managed: bool,
    disabled_operands: Vec<Operand>,
    custom_selectors: Vec<Operand>,
    summary: JsonSummary,
    nodes: Vec<JsonNode<'a>>,
}

#[derive(Serialize)]
struct JsonPolicy<'a> {
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
    message: String,
}

/// The GPU Operator version the audit followed, and where it came from.
#[derive(Serialize)]
struct JsonVersion<'a> {
    version: &'a str,
    era: &'static str,
    /// `given`, `deployment` (its image tag) or `assumed`.
    source: &'static str,
    /// Set when the version is outside the model: what is decided instead.
    #[serde(rename = "outsideModel", skip_serializing_if = "Option::is_none")]
    outside_model: Option<String>,
    message: String,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonSummary {
    nodes: usize,
    nodes_ok: usize,
    running_daemon_set_pods: usize,
    /// Nodes with each finding, by rule id.
    findings: BTreeMap<&'static str, usize>,
}

#[derive(Serialize)]
struct JsonNode<'a> {
    name: &'a str,
    gpu: bool,
    ok: bool,
    operands: &'a [OperandState],
    findings: &'a [AuditFinding],
}

/// `-o json`: the same facts, per node and operand, with the findings.
pub fn json(report: &AuditReport) -> String {
    let facts = &report.facts;
    let source = &facts.source;
    let out = JsonReport {
        cluster_policy: JsonPolicy {
            state: source.state(),
            name: match source {
                PolicySource::Found(name) => Some(name),
                _ => None,
            },
            message: source.describe(),
        },
        stack: facts.stack.in_era(facts.operator.era()).name(),
        operator_version: JsonVersion {
            version: &facts.operator.version.text,
            era: facts.operator.era().name(),
            source: facts.operator.source.state(),
            outside_model: facts.operator.version.outside_model(),
            message: facts.operator.describe(),
        },
        toolkit_managed: facts.toolkit_managed,
        disabled_operands: facts.disabled.iter().collect(),
        custom_selectors: facts.selectors.keys().copied().collect(),
        summary: JsonSummary {
            nodes: report.nodes.len(),
            nodes_ok: report.nodes.iter().filter(|n| n.is_ok()).count(),
            running_daemon_set_pods: report.running_daemonset_pods,
            findings: report
                .rules
                .iter()
                .map(|r| (r.id(), report.count(*r)))
                .collect(),
        },
        nodes: report
            .nodes
            .iter()
            .map(|n| JsonNode {
                name: &n.name,
                gpu: n.gpu,
                ok: n.is_ok(),
                operands: &n.operands,
                findings: &n.findings,
            })
            .collect(),
    };
    // Plain data with string keys: serialization cannot fail.
    serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
}
