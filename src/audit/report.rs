//! The audit as a `ClusterPolicyReport` (`wgpolicyk8s.io/v1alpha2`), the format
//! Kyverno and Policy Reporter read: one result per node and rule; or, as an option
//! ([`Format::OpenReports`]), as the same report in `openreports.io/v1alpha1` (`ClusterReport`),
//! the API Kyverno and Kubewarden moved to: its results and summary have the same fields.
//!
//! Pure: the caller passes the time. Nodes that have nothing to do with GPUs
//! (no GPU, nothing expected, no operand pod) get no results. A report must fit
//! in one object (etcd stores at most ~1.5 MiB), so at most [`MAX_RESULTS`]
//! results are listed, failures and warnings first; `summary` still counts all
//! of them and an annotation says how many were left out.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{AuditReport, FleetAudit, Level, NodeAudit, NodeSummary};
use crate::core::facts::ClusterFacts;
use crate::core::operands::{GPU_CLUSTER_NAME, Stack};
use crate::core::rules::{Rule, Severity};

pub const API_VERSION: &str = "wgpolicyk8s.io/v1alpha2";
pub const KIND: &str = "ClusterPolicyReport";

/// Which report API the audit is written in.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// `wgpolicyk8s.io/v1alpha2` ClusterPolicyReport.
    #[default]
    #[value(name = "wgpolicyk8s")]
    PolicyReport,
    /// `openreports.io/v1alpha1` ClusterReport (openreports/reports-api v0.2.1).
    #[value(name = "openreports")]
    OpenReports,
}

impl Format {
    pub fn group(self) -> &'static str {
        match self {
            Format::PolicyReport => "wgpolicyk8s.io",
            Format::OpenReports => "openreports.io",
        }
    }

    pub fn version(self) -> &'static str {
        match self {
            Format::PolicyReport => "v1alpha2",
            Format::OpenReports => "v1alpha1",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Format::PolicyReport => API_VERSION,
            Format::OpenReports => "openreports.io/v1alpha1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Format::PolicyReport => KIND,
            Format::OpenReports => "ClusterReport",
        }
    }

    pub fn plural(self) -> &'static str {
        match self {
            Format::PolicyReport => "clusterpolicyreports",
            Format::OpenReports => "clusterreports",
        }
    }
}
/// Name of the report object, of the policy and of the source in every result.
pub const NAME: &str = "gpu-deploy-guard";
/// Results listed at most; a result is ~400 bytes, so this stays well under etcd's limit.
pub const MAX_RESULTS: usize = 2000;
/// Rule id of the report-level result saying the ClusterPolicy could not be read.
pub const CLUSTER_POLICY_UNAVAILABLE: &str = "cluster-policy-unavailable";
pub const OMITTED_ANNOTATION: &str = "gpu-deploy-guard.nvidia.com/omitted-results";
/// The GPU Operator version the audit followed and where it came from (given, read from the
/// operator's Deployment, or assumed and why).
pub const OPERATOR_VERSION_ANNOTATION: &str = "gpu-deploy-guard.nvidia.com/operator-version";

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Timestamp {
    pub seconds: i64,
    pub nanos: i32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyReport {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub metadata: Metadata,
    pub results: Vec<ReportResult>,
    pub summary: Summary,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    pub name: &'static str,
    pub labels: BTreeMap<&'static str, &'static str>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<&'static str, String>,
    /// Set only on a write that must find the report as its writer last saw it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Outcome {
    Fail,
    Warn,
    Pass,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportResult {
    pub policy: &'static str,
    pub rule: &'static str,
    pub result: Outcome,
    pub severity: Severity,
    pub message: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceRef>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub properties: BTreeMap<&'static str, &'static str>,
    pub source: &'static str,
    pub timestamp: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub name: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub pass: usize,
    pub fail: usize,
    pub warn: usize,
    pub error: usize,
    pub skip: usize,
}

/// What a pass means, per rule.
fn passed(rule: Rule, node: &str) -> String {
    format!("node {node}: {}", rule.spec().pass)
}

fn count(summary: &mut Summary, outcome: Outcome) {
    match outcome {
        Outcome::Pass => summary.pass += 1,
        Outcome::Fail => summary.fail += 1,
        Outcome::Warn => summary.warn += 1,
    }
}

fn outcome(level: Option<Level>) -> Outcome {
    match level {
        Some(Level::Fail) => Outcome::Fail,
        Some(Level::Warn) => Outcome::Warn,
        None => Outcome::Pass,
    }
}

/// The result of one rule on one node, its message taken from the node's whole audit
/// (`detail`; `None` only if the node's audit could not be made again).
fn result(
    node: &NodeSummary,
    detail: Option<&NodeAudit>,
    rule: Rule,
    now: Timestamp,
) -> ReportResult {
    let found = node.findings.iter().find(|f| f.0 == rule);
    let (message, properties) = match found {
        Some(&(_, level, basis)) => (
            detail
                .and_then(|d| d.findings.iter().find(|f| f.rule == rule))
                .map_or_else(
                    || {
                        format!(
                            "node {}: {} ({}); its details were not available when the report was made",
                            node.name,
                            rule.id(),
                            if level == Level::Fail { "fail" } else { "warn" }
                        )
                    },
                    |f| f.message.clone(),
                ),
            BTreeMap::from([(
                "basis",
                match basis {
                    super::Basis::Pods => "pods",
                    super::Basis::Labels => "labels",
                    super::Basis::History => "history",
                    super::Basis::Status => "status",
                },
            )]),
        ),
        None => (passed(rule, &node.name), BTreeMap::new()),
    };
    ReportResult {
        policy: NAME,
        rule: rule.id(),
        result: outcome(found.map(|f| f.1)),
        severity: rule.spec().severity,
        message,
        resources: vec![ResourceRef {
            api_version: "v1",
            kind: "Node",
            name: node.name.to_string(),
        }],
        properties,
        source: NAME,
        timestamp: now,
    }
}

/// Builds the report of one audit.
pub fn build(report: &AuditReport, now: Timestamp) -> PolicyReport {
    build_from(&report.summary(), |name| report.node(name).cloned(), now)
}

/// The results about the whole cluster: the ClusterPolicy that cannot be read, a ClusterPolicy
/// and a GPUCluster at once.
fn cluster_results(facts: &ClusterFacts, now: Timestamp) -> Vec<ReportResult> {
    let mut results = Vec::new();
    let source = &facts.source;
    if source.is_unavailable() {
        results.push(ReportResult {
            policy: NAME,
            rule: CLUSTER_POLICY_UNAVAILABLE,
            result: Outcome::Warn,
            severity: Severity::Info,
            message: source.describe(),
            resources: Vec::new(),
            properties: BTreeMap::new(),
            source: NAME,
            timestamp: now,
        });
    }
    if facts.stack.in_era(facts.operator.era()) == Stack::Both {
        // The operator reconciles nothing while both exist: one result for the cluster.
        results.push(ReportResult {
            policy: NAME,
            rule: Rule::GpuClusterConflict.id(),
            result: Outcome::Fail,
            severity: Rule::GpuClusterConflict.spec().severity,
            message: format!(
                "a ClusterPolicy and GPUCluster {GPU_CLUSTER_NAME} both exist: the GPU Operator ({}) \
                 reconciles neither and labels no node until one is deleted",
                facts.operator.version.text
            ),
            resources: Vec::new(),
            properties: BTreeMap::new(),
            source: NAME,
            timestamp: now,
        });
    }
    results
}

/// Builds the report of an audit kept as summaries: `detail` makes a node's whole audit again,
/// asked only for the nodes whose results are listed (at most [`MAX_RESULTS`]).
pub fn build_from(
    report: &FleetAudit,
    mut detail: impl FnMut(&str) -> Option<NodeAudit>,
    now: Timestamp,
) -> PolicyReport {
    let mut results = cluster_results(&report.facts, now);
    // Each (node, rule) result is first only its outcome; the messages are made for the ones
    // listed: failures, then warnings, then passes, each in node and rule order, at most
    // MAX_RESULTS in all. A fleet where every node fails costs the results listed, not one
    // message per node and rule.
    let cells = || {
        report
            .nodes
            .iter()
            .filter(|n| n.is_relevant())
            .flat_map(|node| report.rules.iter().map(move |rule| (node, *rule)))
    };
    let outcome = |node: &NodeSummary, rule: Rule| outcome(node.level(rule));
    // The last node made again: a node's listed results are consecutive in each pass below.
    let mut made: Option<NodeAudit> = None;
    let mut result_of = |node: &NodeSummary, rule: Rule| {
        if made.as_ref().is_none_or(|m| m.name.as_str() != &*node.name) {
            made = detail(&node.name);
        }
        result(node, made.as_ref(), rule, now)
    };
    let mut summary = Summary::default();
    for r in &results {
        count(&mut summary, r.result);
    }
    let mut total = results.len();
    for (node, rule) in cells() {
        count(&mut summary, outcome(node, rule));
        total += 1;
    }
    let mut annotations = BTreeMap::from([(
        OPERATOR_VERSION_ANNOTATION,
        report.facts.operator.describe(),
    )]);
    if total > MAX_RESULTS {
        // Failures, then warnings, then passes, each in the order below (the cluster's results,
        // then node and rule order), until the list is full.
        let cluster = std::mem::take(&mut results);
        for wanted in [Outcome::Fail, Outcome::Warn, Outcome::Pass] {
            for r in cluster.iter().filter(|r| r.result == wanted) {
                if results.len() < MAX_RESULTS {
                    results.push(r.clone());
                }
            }
            for (node, rule) in cells() {
                if results.len() >= MAX_RESULTS {
                    break;
                }
                if outcome(node, rule) == wanted {
                    results.push(result_of(node, rule));
                }
            }
        }
        annotations.insert(OMITTED_ANNOTATION, (total - MAX_RESULTS).to_string());
    } else {
        for (node, rule) in cells() {
            results.push(result_of(node, rule));
        }
    }
    PolicyReport {
        api_version: API_VERSION,
        kind: KIND,
        metadata: Metadata {
            name: NAME,
            labels: BTreeMap::from([("app.kubernetes.io/managed-by", NAME)]),
            annotations,
            resource_version: None,
        },
        results,
        summary,
    }
}

impl PolicyReport {
    /// The API the report is in ([`Self::in_format`]).
    pub fn format(&self) -> Format {
        if self.api_version == Format::OpenReports.api_version() {
            Format::OpenReports
        } else {
            Format::PolicyReport
        }
    }

    /// The same report in `format`'s API.
    pub fn in_format(mut self, format: Format) -> PolicyReport {
        self.api_version = format.api_version();
        self.kind = format.kind();
        self
    }

    /// YAML, for `audit -o report`.
    pub fn to_yaml(&self) -> String {
        // Plain data with string keys: serialization cannot fail.
        serde_norway::to_string(self).unwrap_or_default()
    }

    /// Whether two reports say the same, whenever they were made and whatever resourceVersion
    /// they were written over: an unchanged report is not written again.
    pub fn says_the_same(&self, other: &PolicyReport) -> bool {
        let results = self.results.len() == other.results.len()
            && self.results.iter().zip(&other.results).all(|(a, b)| {
                let ReportResult {
                    policy,
                    rule,
                    result,
                    severity,
                    message,
                    resources,
                    properties,
                    source,
                    timestamp: _,
                } = a;
                (
                    policy, rule, result, severity, message, resources, properties, source,
                ) == (
                    &b.policy,
                    &b.rule,
                    &b.result,
                    &b.severity,
                    &b.message,
                    &b.resources,
                    &b.properties,
                    &b.source,
                )
            });
        results
            && self.api_version == other.api_version
            && self.kind == other.kind
            && self.metadata.name == other.metadata.name
            && self.metadata.labels == other.metadata.labels
            && self.metadata.annotations == other.metadata.annotations
            && self.summary == other.summary
    }
}
