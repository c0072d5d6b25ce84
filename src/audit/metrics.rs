//! The continuous audit on `/metrics`.
//!
//! Series grow with problems, not with the fleet: per-node series exist only
//! for nodes with a finding (a missing operand is one), for the operands
//! expected or running there, never with pod names, and they are removed as
//! soon as the node is clean again or gone. The fleet is counted per operand in
//! `operand_nodes{operand,state}` (nodes where it is expected, running,
//! missing: expected and not running, and where a taint holds it: kept but
//! never re-created, or held off). A clean fleet of any size exports a few
//! dozen series. Only the replica holding the audit's Lease audits
//! (`audit_leader` 1); the others export no per-node series and zero counts.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::FleetAudit;
use crate::core::rules::Rule;
use crate::metrics::Metrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeOperand {
    node: String,
    operand: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WatchKind {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperandState {
    operand: &'static str,
    state: &'static str,
}

/// The `state` values of `operand_nodes`: `not_recreated` runs under a taint it does not
/// tolerate (`NoSchedule`) and is never re-created there; `held_off` is kept off by a taint
/// (evicted by a `NoExecute`, never placed under a `NoSchedule`).
const STATES: [&str; 5] = [
    "expected",
    "running",
    "missing",
    "not_recreated",
    "held_off",
];

/// Metric names, without the registry's `gpu_deploy_guard_` prefix.
pub const OPERAND_EXPECTED: &str = "operand_expected";
pub const OPERAND_RUNNING: &str = "operand_running";
pub const AUDIT_FINDINGS: &str = "audit_findings";
pub const AUDIT_LAST_RUN: &str = "audit_last_run_timestamp_seconds";
pub const AUDIT_NODES: &str = "audit_nodes";
pub const CLUSTER_POLICY_AVAILABLE: &str = "cluster_policy_available";
pub const CLUSTER_WATCH_READABLE: &str = "cluster_watch_readable";
pub const NODES_NOT_ITEMIZED: &str = "audit_nodes_not_itemized";

/// Nodes with per-node series at most, by default: a broken fleet (every node with a finding,
/// as after an operator upgrade gone wrong) would otherwise cost two series per operand and
/// node, 150,000 at 15,000 nodes.
pub const DEFAULT_MAX_NODE_SERIES: usize = 500;
pub const OPERAND_NODES: &str = "operand_nodes";
pub const AUDIT_LEADER: &str = "audit_leader";

pub struct AuditMetrics {
    expected: Family<NodeOperand, Gauge>,
    running: Family<NodeOperand, Gauge>,
    findings: Family<RuleLabel, Gauge>,
    operand_nodes: Family<OperandState, Gauge>,
    leader: Gauge,
    last_run: Gauge,
    nodes: Gauge,
    cluster_policy_available: Gauge,
    watch_readable: Family<WatchKind, Gauge>,
    /// Nodes with a problem beyond [`AuditMetrics::max_nodes`]: counted, without series.
    not_itemized: Gauge,
    max_nodes: usize,
    /// The (node, operand) pairs that have series now.
    series: Mutex<HashSet<NodeOperand>>,
    /// The (operand, state) pairs that have series now.
    totals: Mutex<HashSet<OperandState>>,
}

impl AuditMetrics {
    /// Registers the audit's metrics in the process registry; at most `max_nodes` nodes get
    /// per-node series.
    pub fn register(metrics: &Metrics, max_nodes: usize) -> Self {
        let m = AuditMetrics {
            expected: Family::default(),
            running: Family::default(),
            findings: Family::default(),
            operand_nodes: Family::default(),
            leader: Gauge::default(),
            last_run: Gauge::default(),
            nodes: Gauge::default(),
            cluster_policy_available: Gauge::default(),
            watch_readable: Family::default(),
            not_itemized: Gauge::default(),
            max_nodes,
            series: Mutex::new(HashSet::new()),
            totals: Mutex::new(HashSet::new()),
        };
        // Until the ClusterPolicy has been read, the defaults are in use.
        m.cluster_policy_available.set(0);
        for rule in Rule::state_rules() {
            m.findings
                .get_or_create(&RuleLabel { rule: rule.id() })
                .set(0);
        }
        metrics.with_registry(|r| {
            r.register(
                OPERAND_EXPECTED,
                "1 when the operand should run on the node (deploy label, ClusterPolicy, DaemonSet selector); only nodes with a finding have these series",
                m.expected.clone(),
            );
            r.register(
                OPERAND_RUNNING,
                "1 when a pod of the operand's DaemonSet is Running on the node; only nodes with a finding have these series",
                m.running.clone(),
            );
            r.register(
                AUDIT_FINDINGS,
                "Nodes with a finding of the rule at the last audit",
                m.findings.clone(),
            );
            r.register(
                AUDIT_LAST_RUN,
                "Unix time of the last completed audit",
                m.last_run.clone(),
            );
            r.register(AUDIT_NODES, "Nodes seen by the last audit", m.nodes.clone());
            r.register(
                OPERAND_NODES,
                "Nodes where the operand is expected, running, missing (expected and not running), not_recreated (runs under an untolerated NoSchedule taint: never re-created) or held_off (a taint keeps it off), over the whole fleet",
                m.operand_nodes.clone(),
            );
            r.register(
                AUDIT_LEADER,
                "1 when this replica holds the audit's Lease and runs the continuous audit",
                m.leader.clone(),
            );
            r.register(
                CLUSTER_POLICY_AVAILABLE,
                "1 when the GPU Operator's ClusterPolicy could be read; 0 when its defaults are assumed",
                m.cluster_policy_available.clone(),
            );
            r.register(
                NODES_NOT_ITEMIZED,
                "Nodes with a finding or a missing operand that have no operand_expected/operand_running series: past --max-node-series (failures first, then by name, get series); audit_findings counts them all",
                m.not_itemized.clone(),
            );
            r.register(
                CLUSTER_WATCH_READABLE,
                "1 when the kind (clusterpolicies, nvidiadrivers, gpuclusters, daemonsets, deployments, nodes) is listed and followed; 0 while it is not listed yet, forbidden, missing or past the guard's bounds, and the decisions that need it refuse what could break nodes",
                m.watch_readable.clone(),
            );
        });
        m
    }

    /// Whether the watch follows `kind` now.
    pub fn set_watch_readable(&self, kind: &'static str, readable: bool) {
        self.watch_readable
            .get_or_create(&WatchKind { kind })
            .set(i64::from(readable));
    }

    pub fn set_cluster_policy_available(&self, available: bool) {
        self.cluster_policy_available.set(i64::from(available));
    }

    /// Whether this replica runs the audit. Losing the Lease takes its series away, so that
    /// a replica that no longer audits never shows an old state.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        if !leader {
            self.forget();
        }
    }

    fn forget(&self) {
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for gone in series.drain() {
            self.expected.remove(&gone);
            self.running.remove(&gone);
        }
        drop(series);
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for gone in totals.drain() {
            self.operand_nodes.remove(&gone);
        }
        drop(totals);
        for rule in Rule::state_rules() {
            self.findings
                .get_or_create(&RuleLabel { rule: rule.id() })
                .set(0);
        }
        self.nodes.set(0);
        self.not_itemized.set(0);
    }

    /// Publishes one audit, done at `unix_seconds`.
    pub fn record(&self, report: &FleetAudit, unix_seconds: i64) {
        let mut now = HashSet::new();
        let mut counts: HashMap<OperandState, i64> = HashMap::new();
        // The nodes with a problem that get series: failures first, then by name.
        let mut problems: Vec<(bool, &str)> = report
            .nodes
            .iter()
            .filter(|n| !n.findings.is_empty() || !n.missing().is_empty())
            .map(|n| (!n.fails(), &*n.name))
            .collect();
        problems.sort_unstable();
        let itemized: HashSet<&str> = problems
            .iter()
            .take(self.max_nodes)
            .map(|(_, name)| *name)
            .collect();
        self.not_itemized
            .set(i64::try_from(problems.len().saturating_sub(self.max_nodes)).unwrap_or(i64::MAX));
        for node in &report.nodes {
            let problem = itemized.contains(&*node.name);
            for op in node.held_off.iter() {
                let operand = op.name();
                *counts
                    .entry(OperandState {
                        operand,
                        state: "held_off",
                    })
                    .or_default() += 1;
            }
            for op in node.expected.union(node.running).iter() {
                let operand = op.name();
                let (expected, running) = (node.expected.contains(op), node.running.contains(op));
                for (state, yes) in [
                    ("expected", expected),
                    ("running", running),
                    ("missing", expected && !running),
                    ("not_recreated", node.not_recreated.contains(op)),
                ] {
                    if yes {
                        *counts.entry(OperandState { operand, state }).or_default() += 1;
                    }
                }
                if !problem {
                    continue;
                }
                let labels = NodeOperand {
                    node: node.name.to_string(),
                    operand,
                };
                self.expected
                    .get_or_create(&labels)
                    .set(i64::from(expected));
                self.running.get_or_create(&labels).set(i64::from(running));
                now.insert(labels);
            }
        }
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for gone in series.difference(&now) {
            self.expected.remove(gone);
            self.running.remove(gone);
        }
        *series = now;
        drop(series);
        // Every operand the report shows or counts has all three states, zero included, so
        // that `missing` reads 0 rather than absent on a clean fleet.
        let mut totals_now = HashSet::new();
        let mut operands: Vec<&'static str> = report.columns.iter().map(|op| op.name()).collect();
        operands.extend(counts.keys().map(|k| k.operand));
        operands.sort_unstable();
        operands.dedup();
        for operand in operands {
            for state in STATES {
                let key = OperandState { operand, state };
                let value = counts.get(&key).copied().unwrap_or(0);
                self.operand_nodes.get_or_create(&key).set(value);
                totals_now.insert(key);
            }
        }
        let mut totals = self.totals.lock().unwrap_or_else(|e| e.into_inner());
        for gone in totals.difference(&totals_now) {
            self.operand_nodes.remove(gone);
        }
        *totals = totals_now;
        drop(totals);
        for rule in Rule::state_rules() {
            let count = if report.rules.contains(&rule) {
                report.count(rule)
            } else {
                0
            };
            self.findings
                .get_or_create(&RuleLabel { rule: rule.id() })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
        self.nodes
            .set(i64::try_from(report.nodes.len()).unwrap_or(i64::MAX));
        self.last_run.set(unix_seconds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::audit;
    use crate::audit::tests::node;
    use crate::core::facts::operator_defaults;
    use crate::core::policy::Policy;
    use crate::k8s::pod::{PodPhase, PodView};

    fn plugin_pod(node: &str) -> PodView {
        let mut p = PodView {
            node: Some(node.to_owned()),
            phase: PodPhase::Running,
            daemonset: Some("nvidia-device-plugin-daemonset".to_owned()),
            owned: true,
            ..PodView::default()
        };
        p.metadata.name = Some(format!("dp-{node}"));
        p
    }

    /// The audit's lines of the exposition, without HELP and TYPE.
    fn samples(metrics: &Metrics) -> Vec<String> {
        metrics
            .encode()
            .lines()
            .filter(|l| {
                [
                    OPERAND_EXPECTED,
                    OPERAND_RUNNING,
                    AUDIT_FINDINGS,
                    AUDIT_LAST_RUN,
                    AUDIT_NODES,
                    CLUSTER_POLICY_AVAILABLE,
                ]
                .iter()
                .any(|m| l.starts_with(&format!("gpu_deploy_guard_{m}")))
            })
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn gauges_follow_the_audit_and_deleted_nodes_lose_their_series() {
        let metrics = Metrics::new();
        let am = AuditMetrics::register(&metrics, DEFAULT_MAX_NODE_SERIES);
        let nodes = [
            node(
                "a",
                &[("device-plugin", "true"), ("container-toolkit", "true")],
            ),
            node("b", &[("device-plugin", "true")]),
            node("cpu", &[]),
        ];
        let pods = [plugin_pod("a"), plugin_pod("b")];
        let report = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
        am.record(&report.summary(), 1_796_032_800);
        am.set_cluster_policy_available(true);
        let mut got = samples(&metrics);
        got.sort();
        let mut want = [
            "gpu_deploy_guard_operand_expected{node=\"a\",operand=\"container-toolkit\"} 1",
            "gpu_deploy_guard_operand_expected{node=\"a\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_expected{node=\"b\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_running{node=\"a\",operand=\"container-toolkit\"} 0",
            "gpu_deploy_guard_operand_running{node=\"a\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_operand_running{node=\"b\",operand=\"device-plugin\"} 1",
            "gpu_deploy_guard_audit_findings{rule=\"device-plugin-without-toolkit\"} 2",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-toolkit\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-validator\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operands-not-recreated\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"toolkit-not-recreated\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-sandbox-validator\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operand-without-dra-driver\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"dcgm-exporter-without-dcgm\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"device-plugin-on-non-gpu-node\"} 2",
            "gpu_deploy_guard_audit_findings{rule=\"device-plugin-beside-dra-driver\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"foreign-device-plugin\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"operand-not-running\"} 1",
            "gpu_deploy_guard_audit_findings{rule=\"nfd-labels-lost\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"pause-stuck\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"driver-upgrade-stuck\"} 0",
            "gpu_deploy_guard_audit_findings{rule=\"gpus-not-advertised\"} 0",
            "gpu_deploy_guard_audit_last_run_timestamp_seconds 1796032800",
            "gpu_deploy_guard_audit_nodes 3",
            "gpu_deploy_guard_audit_nodes_not_itemized 0",
            "gpu_deploy_guard_cluster_policy_available 1",
        ]
        .map(str::to_owned);
        want.sort();
        assert_eq!(got, want);

        // Node b is deleted: its series go, the others stay.
        let report = audit(
            &nodes[..1],
            &pods[..1],
            &operator_defaults(),
            &Policy::default(),
        );
        am.record(&report.summary(), 1_796_032_860);
        let text = samples(&metrics).join("\n");
        assert!(!text.contains("node=\"b\""), "{text}");
        assert!(
            text.contains(
                "gpu_deploy_guard_operand_running{node=\"a\",operand=\"device-plugin\"} 1"
            )
        );
        assert!(
            text.contains(
                "gpu_deploy_guard_audit_findings{rule=\"device-plugin-without-toolkit\"} 1"
            )
        );
        assert!(text.contains("gpu_deploy_guard_audit_nodes 1"));
    }

    #[test]
    fn the_cluster_policy_is_unavailable_until_read() {
        let metrics = Metrics::new();
        let _am = AuditMetrics::register(&metrics, DEFAULT_MAX_NODE_SERIES);
        assert!(
            samples(&metrics).contains(&"gpu_deploy_guard_cluster_policy_available 0".to_owned())
        );
    }

    #[test]
    fn operands_a_taint_holds_are_counted_per_state() {
        use crate::core::placement::{Effect, Taint};
        let metrics = Metrics::new();
        let am = AuditMetrics::register(&metrics, DEFAULT_MAX_NODE_SERIES);
        let labels = [
            ("device-plugin", "true"),
            ("container-toolkit", "true"),
            ("feature.node.kubernetes.io/pci-10de.present", "true"),
        ];
        let mut kept = node("kept", &labels);
        kept.placement.taints = vec![Taint::new("example.com/maint", "", Effect::NoSchedule)];
        let mut evicted = node("evicted", &labels);
        evicted.placement.taints = vec![Taint::new("example.com/maint", "", Effect::NoExecute)];
        let mut toolkit_pod = plugin_pod("kept");
        toolkit_pod.daemonset = Some("nvidia-container-toolkit-daemonset".to_owned());
        toolkit_pod.metadata.name = Some("tk-kept".to_owned());
        let pods = [plugin_pod("kept"), toolkit_pod];
        let report = audit(
            &[kept, evicted, node("clean", &labels)],
            &pods,
            &operator_defaults(),
            &Policy::default(),
        );
        am.record(&report.summary(), 1_796_032_800);
        let text = metrics.encode();
        for (operand, state, want) in [
            ("container-toolkit", "not_recreated", 1),
            ("device-plugin", "not_recreated", 1),
            ("container-toolkit", "held_off", 1),
            ("device-plugin", "held_off", 1),
            ("container-toolkit", "expected", 2),
            ("container-toolkit", "missing", 1),
        ] {
            let line = format!(
                "gpu_deploy_guard_operand_nodes{{operand=\"{operand}\",state=\"{state}\"}} {want}"
            );
            assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
        }
        let found = format!(
            "gpu_deploy_guard_audit_findings{{rule=\"{}\"}} 1",
            Rule::ToolkitNotRecreated.id()
        );
        assert!(text.lines().any(|l| l == found), "{found} not in\n{text}");
    }

    #[test]
    fn a_broken_fleet_gets_series_for_at_most_the_cap_failures_first() {
        let metrics = Metrics::new();
        let am = AuditMetrics::register(&metrics, 2);
        // a, b, c: the device plugin alone (a failure); d: a warning only (no NVIDIA GPU
        // label under an expected operand is a label finding).
        let nodes = [
            node(
                "d",
                &[("device-plugin", "true"), ("container-toolkit", "true")],
            ),
            node("c", &[("device-plugin", "true")]),
            node("b", &[("device-plugin", "true")]),
            node("a", &[("device-plugin", "true")]),
        ];
        let pods = [plugin_pod("a"), plugin_pod("b"), plugin_pod("c")];
        let report = audit(&nodes, &pods, &operator_defaults(), &Policy::default());
        am.record(&report.summary(), 1);
        let text = metrics.encode();
        let with_series: std::collections::BTreeSet<&str> = ["a", "b", "c", "d"]
            .into_iter()
            .filter(|n| text.contains(&format!("operand_running{{node=\"{n}\"")))
            .collect();
        assert_eq!(with_series, ["a", "b"].into_iter().collect());
        assert!(
            text.contains("gpu_deploy_guard_audit_nodes_not_itemized 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpu_deploy_guard_audit_findings{rule=\"device-plugin-without-toolkit\"} 3"
            ),
            "the findings count every node: {text}"
        );
        am.set_leader(false);
        assert!(
            metrics
                .encode()
                .contains("gpu_deploy_guard_audit_nodes_not_itemized 0")
        );
    }
}
